"""Text front end: normalize → sentences → espeak-ng phonemes → ids. Pure functions, no IO."""
