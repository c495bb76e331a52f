"""The lexicon store against real files: written, renamed into place, broken, removed, mounted
the way Kubernetes mounts a ConfigMap, and watched."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog

from ttsvc.lifecycle.lexicons import LEXICONS_DIR, LexiconStore, Reload
from ttsvc.repository.trust import TrustPolicy

NS = "http://www.w3.org/2005/01/pronunciation-lexicon"


def pls(*entries: tuple[str, str], lang: str = "en-US") -> bytes:
    """A lexicon of (grapheme, alias) entries, one lexeme per line from line 3."""
    lines = "".join(f"  <lexeme><grapheme>{g}</grapheme><alias>{a}</alias></lexeme>\n"
                    for g, a in entries)  # fmt: skip
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<lexicon version="1.0" xmlns="{NS}" '
            f'alphabet="ipa" xml:lang="{lang}">\n{lines}</lexicon>\n').encode()  # fmt: skip


BROKEN = pls(("ACME", "broken")).replace(b"</alias></lexeme>", b"</alias>")
"""The ACME lexicon with its lexeme left open: line 4 closes ``lexicon`` instead."""


def publish(path: Path, data: bytes) -> None:
    """Write beside, then rename into place: never seen half-written."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def said(store: LexiconStore, name: str, text: str) -> list[str]:
    return [m.lexeme.alias or "" for m in store.current.find(text, [name])]


class Clock:
    """Monotonic and wall time that move only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def engines(tmp_path: Path) -> Path:
    (tmp_path / "engines" / LEXICONS_DIR).mkdir(parents=True)
    return tmp_path / "engines"


def make_store(engines: Path, **kwargs: object) -> LexiconStore:
    clock = Clock()
    return LexiconStore(engines, settle_s=0, clock=clock, wall=clock, **kwargs)  # type: ignore[arg-type]


def test_loads_every_lexicon_file_by_its_stem(engines: Path) -> None:
    folder = engines / LEXICONS_DIR
    brands = pls(("ACME", "acme corporation"))
    publish(folder / "brands.pls", brands)
    publish(folder / "de.xml", pls(("GmbH", "Gesellschaft"), lang="de-DE"))
    for ignored in (".hidden.pls", "brands.pls.bak", "notes.txt", "old.pls~"):
        (folder / ignored).write_bytes(b"not a lexicon")
    (folder / "sub.pls").mkdir()  # a directory named like a file is not one
    store = make_store(engines)
    report = store.reload()
    assert report == Reload(loaded=("brands", "de"))
    assert said(store, "brands", "ACME rocks") == ["acme corporation"]
    assert store.current.for_language("de_DE") == ("de",)
    assert store.describe() == {
        "lexicons": [
            {"name": "brands", "lang": "en-US", "lexemes": 1, "file": "brands.pls",
             "loaded_at": "1970-01-01T00:16:40+00:00",
             "sha256": hashlib.sha256(brands).hexdigest()},
            {"name": "de", "lang": "de-DE", "lexemes": 1, "file": "de.xml",
             "loaded_at": "1970-01-01T00:16:40+00:00",
             "sha256": hashlib.sha256(pls(("GmbH", "Gesellschaft"), lang="de-DE")).hexdigest()},
        ],
        "refused": [],
    }  # fmt: skip


def test_an_edit_renamed_into_place_is_picked_up_and_a_held_set_does_not_change(
    engines: Path,
) -> None:
    path = engines / LEXICONS_DIR / "brands.pls"
    publish(path, pls(("ACME", "first")))
    store = make_store(engines)
    store.reload()
    held = store.current  # what a request in flight took
    publish(path, pls(("ACME", "second"), ("Globex", "globe ex")))
    assert store.reload() == Reload(loaded=("brands",))
    assert said(store, "brands", "ACME Globex") == ["second", "globe ex"]
    assert [m.lexeme.alias for m in held.find("ACME Globex", ["brands"])] == ["first"]
    assert store.describe()["lexicons"][0]["lexemes"] == 2


def test_a_touch_or_the_same_bytes_again_change_nothing(engines: Path) -> None:
    path = engines / LEXICONS_DIR / "brands.pls"
    publish(path, pls(("ACME", "first")))
    store = make_store(engines)
    store.reload()
    held = store.current
    os.utime(path, ns=(1, 1))
    publish(path, path.read_bytes())  # a new inode, the same bytes
    assert store.reload() == Reload()
    assert store.current is held


def test_a_broken_edit_is_refused_with_its_line_and_the_old_version_kept(engines: Path) -> None:
    path = engines / LEXICONS_DIR / "brands.pls"
    good = pls(("ACME", "first"))
    publish(path, good)
    store = make_store(engines)
    store.reload()
    publish(path, BROKEN)
    with structlog.testing.capture_logs() as logs:
        assert store.reload() == Reload(refused=("brands.pls",))
        assert store.reload() == Reload()  # said once, not at every look
    (refusal,) = [e for e in logs if e["event"] == "lexicon_refused"]
    assert refusal["file"] == "brands.pls" and refusal["log_level"] == "error"
    assert (refusal["line"], refusal["column"]) == (4, 3)
    assert "mismatched tag" in refusal["reason"]
    assert said(store, "brands", "ACME") == ["first"]
    described = store.describe()
    assert described["lexicons"][0]["sha256"] == hashlib.sha256(good).hexdigest()
    (refused,) = described["refused"]
    assert refused == {"file": "brands.pls", "name": "brands", "line": 4, "column": 3,
                       "reason": refusal["reason"], "refused_at": "1970-01-01T00:16:40+00:00",
                       "serving_sha256": hashlib.sha256(good).hexdigest()}  # fmt: skip

    publish(path, pls(("ACME", "fixed")))
    assert store.reload() == Reload(loaded=("brands",))
    assert said(store, "brands", "ACME") == ["fixed"]
    assert store.describe()["refused"] == []


def test_a_semantic_error_is_refused_at_its_lexeme(engines: Path) -> None:
    path = engines / LEXICONS_DIR / "brands.pls"
    publish(path, pls(("ACME", "a"), ("Globex", "")))
    store = make_store(engines)
    assert store.reload() == Reload(refused=("brands.pls",))
    (refused,) = store.describe()["refused"]
    assert (refused["line"], refused["column"], refused["serving_sha256"]) == (4, 3, None)
    assert "empty <alias>" in str(refused["reason"])
    assert "brands" not in store.current


def test_a_removed_file_is_dropped_and_its_refusal_forgotten(engines: Path) -> None:
    folder = engines / LEXICONS_DIR
    publish(folder / "brands.pls", pls(("ACME", "a")))
    publish(folder / "bad.pls", BROKEN)
    store = make_store(engines)
    assert store.reload() == Reload(loaded=("brands",), refused=("bad.pls",))
    (folder / "brands.pls").unlink()
    (folder / "bad.pls").unlink()
    with structlog.testing.capture_logs() as logs:
        assert store.reload() == Reload(dropped=("brands",))
    assert [(e["event"], e["name"]) for e in logs] == [("lexicon_removed", "brands")]
    assert store.describe() == {"lexicons": [], "refused": []}
    assert len(store.current) == 0


def test_a_missing_directory_is_no_lexicons(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    assert store.reload() == Reload()
    assert store.describe() == {"lexicons": [], "refused": []}


def test_a_directory_of_its_own_may_be_named(tmp_path: Path) -> None:
    mounted = tmp_path / "etc" / "lexicons"
    mounted.mkdir(parents=True)
    publish(mounted / "brands.pls", pls(("ACME", "a")))
    store = make_store(tmp_path / "engines", directory=mounted)
    assert store.reload() == Reload(loaded=("brands",))
    assert store.directory == mounted and store.root == mounted.parent


def test_two_files_of_one_name_load_the_first(engines: Path) -> None:
    folder = engines / LEXICONS_DIR
    publish(folder / "brands.pls", pls(("ACME", "pls")))
    publish(folder / "brands.xml", pls(("ACME", "xml")))
    store = make_store(engines)
    assert store.reload() == Reload(loaded=("brands",), refused=("brands.xml",))
    assert said(store, "brands", "ACME") == ["pls"]
    (refused,) = store.describe()["refused"]
    assert refused["reason"] == "lexicon 'brands' is already defined by brands.pls"
    (folder / "brands.pls").unlink()
    assert store.reload() == Reload(loaded=("brands",))
    assert said(store, "brands", "ACME") == ["xml"]


def test_a_file_still_changing_is_refused_only_once_settled(engines: Path) -> None:
    path = engines / LEXICONS_DIR / "brands.pls"
    publish(path, pls(("ACME", "first")))
    clock = Clock()
    store = LexiconStore(engines, settle_s=5.0, clock=clock, wall=clock)
    store.reload()
    complete = pls(("ACME", "second"))
    path.write_bytes(complete[: len(complete) // 2])  # a copy in progress
    assert store.reload() == Reload(pending=("brands.pls",), recheck_s=5.0)
    clock.now += 2
    assert store.reload() == Reload(pending=("brands.pls",), recheck_s=3.0)
    assert said(store, "brands", "ACME") == ["first"]
    assert store.describe()["refused"] == []
    clock.now += 3
    assert store.reload() == Reload(refused=("brands.pls",))  # kept still: it is what it is
    path.write_bytes(complete)  # the copy went on after all
    assert store.reload() == Reload(loaded=("brands",))
    assert said(store, "brands", "ACME") == ["second"]


def test_what_is_there_at_the_first_load_is_judged_at_once(engines: Path) -> None:
    publish(engines / LEXICONS_DIR / "bad.pls", BROKEN)
    clock = Clock()
    store = LexiconStore(engines, settle_s=5.0, clock=clock, wall=clock)
    assert store.reload() == Reload(refused=("bad.pls",))


def test_a_file_anyone_may_write_is_not_trusted(engines: Path) -> None:
    path = engines / LEXICONS_DIR / "brands.pls"
    publish(path, pls(("ACME", "a")))
    store = make_store(engines, trust=TrustPolicy.of(engines))
    assert store.reload() == Reload(loaded=("brands",))
    path.chmod(0o666)
    assert store.reload() == Reload(refused=("brands.pls",))
    (refused,) = store.describe()["refused"]
    assert "writable by anyone" in str(refused["reason"]) and refused["line"] is None
    assert said(store, "brands", "ACME") == ["a"]


def configmap_update(folder: Path, files: dict[str, bytes], generation: int) -> None:
    """What the kubelet does to a ConfigMap volume: a new hidden directory of the files, a
    ``..data`` link swapped to it by rename, and each file a link through ``..data``."""
    folder.chmod(0o777)  # the kubelet's mode for the volume's directory (mounted read-only)
    data_dir = folder / f"..gen_{generation}"
    data_dir.mkdir(mode=0o755)
    for name, content in files.items():
        (data_dir / name).write_bytes(content)
    (folder / "..data_tmp").symlink_to(data_dir.name)
    (folder / "..data_tmp").replace(folder / "..data")
    for name in files:
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(f"..data/{name}")
    for old in folder.glob("..gen_*"):
        if old != data_dir:
            shutil.rmtree(old)


def test_a_configmap_mount_is_read_through_its_links(engines: Path) -> None:
    folder = engines / LEXICONS_DIR
    configmap_update(folder, {"brands.pls": pls(("ACME", "first"))}, 1)
    store = make_store(engines, trust=TrustPolicy.of(engines))
    assert store.reload() == Reload(loaded=("brands",))
    configmap_update(folder, {"brands.pls": pls(("ACME", "second"))}, 2)
    assert store.reload() == Reload(loaded=("brands",))
    assert said(store, "brands", "ACME") == ["second"]


# --- watching ---------------------------------------------------------------------------------


class Watched:
    """A store's watch running on the test's loop, its reports in a queue."""

    def __init__(self, store: LexiconStore) -> None:
        self.store = store
        self.reports: asyncio.Queue[Reload] = asyncio.Queue()
        store.on_reload = self.reports.put_nowait
        self.task = asyncio.create_task(store.watch())

    async def until(self, wanted: Callable[[Reload], bool]) -> Reload:
        """The first report ``wanted`` accepts (a generous bound only against a hang)."""
        while True:
            report = await asyncio.wait_for(self.reports.get(), 60)
            if wanted(report):
                return report

    async def first(self, change: Callable[[], None], wanted: Callable[[Reload], bool]) -> None:
        """Make ``change`` until the watch reports it: it starts with no "ready" signal."""
        for _attempt in range(60):
            await asyncio.to_thread(change)
            with contextlib.suppress(asyncio.TimeoutError):
                while not wanted(await asyncio.wait_for(self.reports.get(), 1.0)):
                    pass
                return
        raise AssertionError("the watch never reported the change")

    async def close(self) -> None:
        self.store.stop()
        await asyncio.wait_for(self.task, 60)


def test_the_watch_follows_edits_removals_and_the_directory_itself(engines: Path) -> None:
    folder = engines / LEXICONS_DIR
    path = folder / "brands.pls"

    async def scenario() -> None:
        # looks often without events: a change made as the watch restarts is seen soon
        store = make_store(engines, look_again_s=0.2)
        watched = Watched(store)
        try:
            generation = iter(range(1000))
            await watched.first(
                lambda: publish(path, pls(("ACME", f"v{next(generation)}"))),
                lambda r: "brands" in r.loaded,
            )
            publish(path, pls(("ACME", "edited")))
            await watched.until(lambda r: "brands" in r.loaded)
            assert said(store, "brands", "ACME") == ["edited"]
            publish(path, BROKEN)
            await watched.until(lambda r: "brands.pls" in r.refused)
            assert said(store, "brands", "ACME") == ["edited"]
            path.unlink()
            await watched.until(lambda r: "brands" in r.dropped)

            # the directory goes, and comes back renamed into place with a file in it
            shutil.rmtree(folder)
            staged = engines / ".staging-lexicons"
            staged.mkdir()
            publish(staged / "brands.pls", pls(("ACME", "back")))
            staged.rename(folder)
            await watched.until(lambda r: "brands" in r.loaded)
            assert said(store, "brands", "ACME") == ["back"]

            # once watched again, a ConfigMap-style update swaps its hidden link only
            await watched.first(
                lambda: publish(folder / "other.pls", pls(("Initech", f"i{next(generation)}"))),
                lambda r: "other" in r.loaded,
            )
            (folder / "brands.pls").unlink()
            configmap_update(folder, {"brands.pls": pls(("ACME", "mounted"))}, 1)
            await watched.until(lambda r: "brands" in r.loaded)
            configmap_update(folder, {"brands.pls": pls(("ACME", "updated"))}, 2)
            await watched.until(lambda r: "brands" in r.loaded)
            assert said(store, "brands", "ACME") == ["updated"]
        finally:
            await watched.close()

    asyncio.run(scenario())


def test_a_pending_file_is_looked_at_again_without_another_event(engines: Path) -> None:
    path = engines / LEXICONS_DIR / "brands.pls"
    publish(path, pls(("ACME", "first")))

    async def scenario() -> None:
        clock = Clock()
        store = LexiconStore(engines, settle_s=0.05, clock=clock, wall=clock)
        reports: asyncio.Queue[Reload] = asyncio.Queue()
        store.on_reload = reports.put_nowait
        await store.refresh()
        await reports.get()
        path.write_bytes(BROKEN)
        assert (await store.refresh()).pending == ("brands.pls",)
        await reports.get()
        clock.now += 1  # past the settle time: a re-check the store scheduled judges it
        while not (await asyncio.wait_for(reports.get(), 60)).refused:
            pass  # a re-check that ran before the clock moved: still pending
        assert store.describe()["refused"][0]["file"] == "brands.pls"
        assert said(store, "brands", "ACME") == ["first"]
        store.stop()

    asyncio.run(scenario())
