"""Which engine files may be trusted, judged on real files, modes, owners and links under
tmp_path."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ttsvc.repository.layout import EngineVersion
from ttsvc.repository.trust import TrustPolicy
from ttsvc.repository.watcher import check_version


@pytest.fixture
def root(tmp_path: Path) -> Path:
    engines = tmp_path / "engines"
    (engines / "voice" / "1").mkdir(parents=True)
    (engines / "voice" / "1" / "a.onnx").write_bytes(b"engine")
    return engines


def test_files_only_their_publisher_may_write_are_trusted(root: Path) -> None:
    policy = TrustPolicy.of(root)
    target = root / "voice" / "1" / "a.onnx"
    assert policy.problem(target) is None
    target.chmod(0o666)
    assert "writable by anyone (mode 0666)" in str(policy.problem(target))
    target.chmod(0o664)  # group-writable: the publisher's group, not anyone
    assert policy.problem(target) is None
    assert policy.problem(root / "voice" / "1" / "missing.onnx") is None  # the manifest's job
    assert TrustPolicy.of(root, off=True).problem(target.parent) is None


def test_a_world_writable_directory_is_trusted_only_with_the_sticky_bit(root: Path) -> None:
    policy = TrustPolicy.of(root)
    version = root / "voice" / "1"
    version.chmod(0o777)
    assert "writable by anyone" in str(policy.problem(version))
    version.chmod(0o1777)  # as /tmp: others cannot replace what is in it
    assert policy.problem(version) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_files_of_a_stranger_are_not_trusted_but_the_root_owner_s_are(root: Path) -> None:
    target = root / "voice" / "1" / "a.onnx"
    os.chown(target, 54321, 54321)
    assert "owned by user 54321" in str(TrustPolicy.of(root).problem(target))
    os.chown(root, 54321, 54321)  # whoever owns the engines directory can replace anything
    assert TrustPolicy.of(root).problem(target) is None


def test_links_must_stay_inside_the_engines_directory(root: Path, tmp_path: Path) -> None:
    policy = TrustPolicy.of(root)
    inside = root / "voice" / "current"
    inside.symlink_to(root / "voice" / "1", target_is_directory=True)
    assert policy.problem(inside) is None  # a ConfigMap's ..data links stay inside
    outside = tmp_path / "elsewhere"
    shutil.copytree(root / "voice", outside)
    (root / "linked").symlink_to(outside, target_is_directory=True)
    assert "leads outside the engines directory" in str(policy.problem(root / "linked"))
    (root / "voice" / "1" / "b.onnx").symlink_to(outside / "1" / "a.onnx")
    assert "leads outside" in str(policy.problem(root / "voice" / "1" / "b.onnx"))


def test_a_version_check_names_what_may_not_be_trusted(root: Path) -> None:
    (root / "voice" / "1" / "manifest.json").write_text("{}")  # unreadable as a manifest
    version = EngineVersion("voice", 1, root / "voice" / "1")
    policy = TrustPolicy.of(root)
    assert check_version(version, {}, policy).refusal() is None
    (root / "voice").chmod(0o777)
    refusal = check_version(version, {}, policy).refusal()
    assert refusal is not None and refusal.file is None
    assert refusal.reason.startswith("voice directory: writable by anyone")
    (root / "voice").chmod(0o755)
    (root / "voice" / "1" / "manifest.json").chmod(0o666)
    refusal = check_version(version, {}, policy).refusal()
    assert refusal is not None and refusal.file == "manifest.json"
    assert check_version(version, {}, None).refusal() is None  # no policy: no such check
