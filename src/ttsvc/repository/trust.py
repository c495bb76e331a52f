"""Whether the files of an engines directory may be trusted to be what their publisher put there.

Why: a worker parses whatever the engines directory holds, and a manifest only proves that the
bytes are those its writer hashed, not who the writer was. A file anyone on the node may write,
a file owned by a stranger, or a link that leads out of the engines directory lets someone other
than the publisher choose what the service loads. So, as Triton and TF Serving resolve model
paths inside their repository, a version is served only if the voice directory, the version
directory, its manifest and every file it lists:

* resolve to a place inside the engines directory (a symlink within it is fine: a Kubernetes
  ConfigMap mount is made of them);
* are not writable by everyone (a directory with the sticky bit excepted: others cannot replace
  what is in it);
* are owned by root, by the service's own user, or by the engines directory's owner (who can
  replace anything in it anyway).

A version that fails is refused like one that fails its manifest, with the file and the reason
(``GET /voices``, the ``engine_rejected`` log line); ``Settings.trust_engine_files`` turns the
check off for filesystems that show every file as anyone's (some CIFS mounts). The chart's
read-only mount already keeps the pod itself from writing there; it cannot stop other writers on
the node (docs/deploy.md).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TrustPolicy:
    """Where engines may live and who may own them; ``None`` of it applies when ``off``."""

    root: Path
    """The engines directory, resolved."""
    owners: frozenset[int]
    """User ids a file or directory may belong to."""
    off: bool = False

    @classmethod
    def of(cls, root: Path, off: bool = False) -> TrustPolicy:
        """The policy for the engines directory ``root`` (blocking: it stats the root)."""
        resolved = root.resolve()
        try:
            owner = resolved.stat().st_uid
        except OSError:
            owner = os.geteuid()
        return cls(resolved, frozenset({0, os.geteuid(), owner}), off)

    def problem(self, path: Path) -> str | None:
        """Why ``path`` may not be trusted, or ``None`` (also for a path that is missing:
        the manifest check reports that)."""
        if self.off:
            return None
        try:
            resolved = path.resolve(strict=True)
            st = resolved.stat()
        except (OSError, RuntimeError):  # missing, or a loop of links
            return None
        if not resolved.is_relative_to(self.root):
            return "leads outside the engines directory (a link to another place)"
        sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_mode & stat.S_IWOTH and not sticky_dir:
            return (f"writable by anyone (mode {stat.S_IMODE(st.st_mode):04o}): "
                    "chmod o-w it, or anyone on the node chooses what is served")  # fmt: skip
        if st.st_uid not in self.owners:
            return (f"owned by user {st.st_uid}, neither root, this service's user nor the "
                    "engines directory's owner: chown it")  # fmt: skip
        return None
