"""ttsvc: streaming text-to-speech inference service.

Importing the package has no side effects: no environment reads, no model loads, no threads.
"""

__version__ = "0.1.0"
