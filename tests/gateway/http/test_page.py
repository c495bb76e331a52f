"""The try-it page at ``GET /`` on a real `ttsvc serve` with API keys on: its files come from the
service itself, and in a real browser (Debian's headless Chromium) it streams speech, measures
the time to first audio and shows the API's own error text."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait

from tests.gateway.serving import Server, keyed_server, write_keys
from ttsvc.repository.layout import EngineVersion

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOT = Path(__file__).resolve().parents[3] / "docs" / "page.png"
BROWSER_WAIT_S = 120  # bounded: the DOM is polled, the wait ends as soon as the page is there
ASSETS = {
    "/": "text/html",
    "/static/page.js": "javascript",
    "/static/page.css": "text/css",
    "/static/favicon.svg": "image/svg+xml",
}


@pytest.fixture(scope="module")
def server(
    default_version: EngineVersion, engines_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    key_file = tmp_path_factory.mktemp("page-keys") / "keys"
    key = write_keys(key_file, {"page": {}})["page"]
    with keyed_server(engines_root, key_file, key) as srv:
        yield srv


def test_page_and_its_assets_are_public_and_same_origin(server: Server) -> None:
    anonymous = httpx.Client(base_url=server.url, timeout=30)
    with anonymous:
        assert anonymous.get("/voices").status_code == 401  # keys are on ...
        for path, kind in ASSETS.items():
            r = anonymous.get(path)  # ... and the page is public all the same
            assert r.status_code == 200, path
            assert kind in r.headers["content-type"], (path, r.headers["content-type"])
            # nothing from another host: no CDN, no absolute URL at all (an SVG's XML namespace
            # is a name, never fetched)
            assert not re.search(r"https?://", re.sub(r'xmlns="[^"]*"', "", r.text)), path
        page = anonymous.get("/")
        for path in ASSETS:
            if path != "/":  # referenced relatively, so they resolve to this very service
                assert f'"{path.lstrip("/")}"' in page.text
        assert "default-src 'none'" in page.headers["content-security-policy"]
        missing = anonymous.get("/static/nothing.js")  # the service's own error shape
        assert (missing.status_code, missing.json()["type"]) == (404, "not_found")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        pytest.skip(f"needs Debian's chromium and chromium-driver ({CHROMIUM}, {CHROMEDRIVER})")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=900,960",
                 "--autoplay-policy=no-user-gesture-required",
                 f"--user-data-dir={tmp_path / 'profile'}"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(tmp_path / "profile", ignore_errors=True)


def test_the_page_streams_speech_and_shows_api_errors(server: Server, browser: WebDriver) -> None:
    wait = WebDriverWait(browser, BROWSER_WAIT_S)
    browser.get(server.url + "/")
    result = browser.find_element(By.ID, "result")

    # without the key the page says why it has no voice, in the API's words
    wait.until(lambda _: result.get_attribute("data-state") == "error")
    assert "401 unauthorized" in browser.find_element(By.ID, "error").text
    key_input = browser.find_element(By.ID, "key")
    key_input.send_keys(server.headers["Authorization"].removeprefix("Bearer "))
    browser.find_element(By.ID, "text").click()  # leaving the field reloads the voices
    voice = Select(browser.find_element(By.ID, "voice"))
    wait.until(lambda _: len(voice.options) > 0)
    names = [v["name"] for v in server.client.get("/voices").json()["voices"]]
    assert [o.get_attribute("value") for o in voice.options] == names
    assert voice.options[0].text == "en_US-joe-medium (English)"  # the language /voices gives

    # the page offers only what a browser plays (no µ-law)
    offered = Select(browser.find_element(By.ID, "format")).options
    assert [o.get_attribute("value") for o in offered] == ["pcm", "wav", "mp3", "opus", "flac"]

    # a bad choice: Opus at 22050 Hz; the page shows the API's own error, not a generic one
    text = browser.find_element(By.ID, "text")
    text.clear()
    text.send_keys("Streaming speech, straight from the service.")
    Select(browser.find_element(By.ID, "format")).select_by_value("opus")
    Select(browser.find_element(By.ID, "rate")).select_by_value("22050")
    browser.find_element(By.ID, "speak").click()
    wait.until(lambda _: result.get_attribute("data-state") == "error")
    refused = server.synth("Hi.", format="opus", sample_rate=22050)
    assert refused.status_code == 422
    shown = browser.find_element(By.ID, "error").text
    assert refused.json()["error"] in shown and refused.json()["type"] in shown
    assert "field: sample_rate" in shown

    # streamed PCM played through Web Audio as it arrives, with the page's own TTFA
    Select(browser.find_element(By.ID, "format")).select_by_value("pcm")
    Select(browser.find_element(By.ID, "rate")).select_by_value("")
    browser.find_element(By.ID, "speak").click()
    wait.until(lambda _: result.get_attribute("data-state") == "done")
    assert not browser.find_element(By.ID, "error").is_displayed()
    ttfa_ms = result.get_attribute("data-ttfa-ms")
    assert ttfa_ms is not None and int(ttfa_ms) >= 0
    assert browser.find_element(By.ID, "ttfa").text == f"{ttfa_ms} ms"
    samples = int(result.get_attribute("data-samples") or 0)
    rate = int(result.get_attribute("data-rate") or 0)
    assert samples > rate // 2  # over half a second of speech for a six-word sentence
    assert int(result.get_attribute("data-bytes") or 0) == 2 * samples
    # and the audio clock went through all of it (Chromium's headless audio output runs in time)
    wait.until(lambda _: result.get_attribute("data-played") == str(samples))
    # each word is marked in the text as it is heard (the page asks for pcm with its word
    # times), the last one last
    spoken = browser.find_element(By.ID, "spoken")
    wait.until(lambda _: result.get_attribute("data-highlighted") == "6")  # six words
    assert spoken.text == "Streaming speech, straight from the service."
    assert spoken.find_element(By.TAG_NAME, "mark").text == "service"
    # what was heard can be kept: a WAV of exactly the samples received
    download = browser.find_element(By.ID, "download")
    assert download.is_displayed() and download.get_attribute("download") == "speech.wav"
    assert (download.get_attribute("href") or "").startswith("blob:")
    SCREENSHOT.parent.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(SCREENSHOT))

    # another format: the whole file, then an <audio> element plays it
    Select(browser.find_element(By.ID, "format")).select_by_value("mp3")
    browser.find_element(By.ID, "speak").click()
    wait.until(lambda _: result.get_attribute("data-state") == "done")
    assert int(result.get_attribute("data-bytes") or 0) > 0
    player = browser.find_element(By.ID, "player")
    assert player.is_displayed() and (player.get_attribute("src") or "").startswith("blob:")
    # a whole file's time to first audio is its first sound, not its first bytes
    wait.until(lambda _: browser.find_element(By.ID, "ttfa-how").text == "(first sound)")
    assert int(result.get_attribute("data-ttfa-ms") or -1) >= 0
    assert browser.find_element(By.ID, "download").get_attribute("download") == "speech.mp3"

    # the SSML switch: the text goes as a document (its alias is said, its words are marked in
    # the markup); switched on, plain text is wrapped in <speak> to start from
    Select(browser.find_element(By.ID, "format")).select_by_value("pcm")
    browser.find_element(By.ID, "ssml").click()
    assert text.get_attribute("value").startswith("<speak>Streaming speech")
    text.clear()
    text.send_keys('<speak>Read the <sub alias="World Wide Web">WWW</sub>.</speak>')
    browser.find_element(By.ID, "speak").click()
    wait.until(lambda _: result.get_attribute("data-state") == "done")
    wait.until(lambda _: result.get_attribute("data-highlighted") == "5")  # Read the World Wide Web
    assert spoken.find_element(By.TAG_NAME, "mark").text == "WWW"
