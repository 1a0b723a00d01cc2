"""The attention explorer (GET /explorer) in a real browser: Debian's headless Chromium driven by Selenium, against
real servers on loopback. Every number the page shows is checked against the same server's gRPC reply: the word
pieces labelling the heatmap, the weight under the pointer, rollout, norms and head statistics; the head view's
toggles, the model view's thumbnails, the comparison (of two texts, and of one text under two served models), the
downloads, a wrong API key, a 512-token input's time to draw, and the standalone file from standalone_html() opened
from file:// with no server.

Each view's screenshot is saved to ATTNSERVE_TEST_SCREENSHOTS when set (else the test's tmp_path), to look at.
Without Chromium and chromedriver the tests skip, and under CI they fail.
"""

from __future__ import annotations

import base64
import os
import shutil
import string
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import numpy as np
import pytest

from attnserve.explorer_page import standalone_html
from attnserve.v1 import encoder_pb2 as pb

from .checkpoints import save_sentence_transformer, save_tiny_bert
from .serving import ServerProcess, serving

TEXT = "The cat sat on the mat because it was tired."
SAME_LENGTH = "The dog sat on the rug because it was tired."  # as many word pieces as TEXT
LONGER = "A much longer sentence, with quite a few more word pieces than the first one had."
PAIR = ("Where does the cat sleep?", "The cat sleeps on the warm mat.")
API_KEY = "explorer-test-key"
SERVER_ONLY = ["model", "api-key", "text", "text-b", "show", "download-html", "tab-compare"]


# --- the browser -------------------------------------------------------------------------------------------------

def _unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: CI must run the explorer's browser tests (.ci/run installs Debian's chromium)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def downloads(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(downloads):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _unavailable("selenium is not installed (pip install -e '.[dev]')")
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not chromedriver:
        _unavailable("no chromium and chromedriver on PATH (apt-get install chromium chromium-driver)")
    options = Options()
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1200",
                     "--force-device-scale-factor=1"):
        options.add_argument(argument)
    options.binary_location = chromium
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                              "download.prompt_for_download": False})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def shots(tmp_path) -> Path:
    folder = Path(os.environ.get("ATTNSERVE_TEST_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def js(driver, script: str, *args):
    return driver.execute_script(f"return {script}", *args)


def wait_for(driver, condition: str, timeout: float = 30, *args):
    """Until the JavaScript expression `condition` is truthy; its value."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.02).until(lambda d: js(d, condition, *args))


def idle(driver) -> None:
    wait_for(driver, "window.explorer && window.explorer.state().busy === 0")


def element(driver, id_: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, id_)


def select(driver, id_: str, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(element(driver, id_)).select_by_value(value)


def page_errors(driver) -> list[str]:
    """The page's own failures, and the console's errors but for the HTTP refusals a test provokes."""
    errors = js(driver, "window.explorer.state().errors")
    console = [e["message"] for e in driver.get_log("browser")
               if e["level"] == "SEVERE" and "Failed to load resource" not in e["message"]]
    return errors + console


def open_page(driver, url: str) -> None:
    driver.get(f"{url}/explorer")
    wait_for(driver, "window.explorer !== undefined")
    idle(driver)


def drawn(driver, name: str = "heatmap") -> int:
    info = js(driver, "window.explorer.mapInfo(arguments[0])", name)
    return info["drawCount"] if info else 0


def show(driver, text: str, text_b: str = "", typed: bool = False) -> None:
    """Text (and segment b) in, Show pressed, until the heatmap is drawn anew."""
    if typed:
        element(driver, "text").clear()
        element(driver, "text").send_keys(text)
    else:
        js(driver, "arguments[0].value = arguments[1]", element(driver, "text"), text)
    js(driver, "arguments[0].value = arguments[1]", element(driver, "text-b"), text_b)
    before = drawn(driver)
    element(driver, "show").click()
    wait_for(driver, f"window.explorer.heatmapInfo() && window.explorer.heatmapInfo().drawCount > {before}")
    idle(driver)


def change(driver, id_: str, value: str, name: str = "heatmap") -> None:
    before = drawn(driver, name)
    select(driver, id_, value)
    wait_for(driver, f"window.explorer.mapInfo('{name}').drawCount > {before}")
    idle(driver)


def point_at(driver, x: float, y: float) -> None:
    """A real pointer move (WebDriver actions) to client coordinates."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    actions = ActionBuilder(driver)
    actions.pointer_action.move_to_location(round(x), round(y))
    actions.perform()


def hover_cell(driver, row: int, col: int, name: str = "heatmap", readout: str = "hover") -> tuple[int, int, float]:
    """Points at a map's cell through its documented centre; what the readout then says (row, col, value)."""
    js(driver, "arguments[0].scrollIntoView({block: 'center'})", element(driver, name))
    centre = js(driver, "window.explorer.mapCellCenter(arguments[0], arguments[1], arguments[2])", name, row, col)
    point_at(driver, 1, 1)  # away first: a move to where the pointer already is need not be an event
    point_at(driver, centre["x"], centre["y"])
    box = element(driver, readout)
    return (int(box.get_attribute("data-row")), int(box.get_attribute("data-col")),
            float(box.get_attribute("data-value")))


def tab(driver, name: str) -> None:
    element(driver, f"tab-{name}").click()
    idle(driver)


def screenshot(driver, shots: Path, name: str, at: str | None = None) -> None:
    """The page from its top, or from the element `at` (the tabs, for a view taller than the window)."""
    if at:
        js(driver, "arguments[0].scrollIntoView()", element(driver, at))
    else:
        js(driver, "window.scrollTo(0, 0)")
    assert driver.save_screenshot(str(shots / f"explorer-{name}.png"))


# --- the servers' own answers ------------------------------------------------------------------------------------

def as_array(t: pb.Tensor) -> np.ndarray:
    return np.frombuffer(t.data, "<f4").reshape(tuple(t.shape))


def grpc_attention(stub, item: pb.Input, layers: list[int], analyses=(), model: str = "") -> pb.Embedding:
    """The server's own reply (its key sent: a server without keys ignores it)."""
    request = pb.EmbedRequest(model=model, inputs=[item],
                              attention=pb.AttentionOptions(layers=layers, analyses=list(analyses)))
    return stub.Embed(request, timeout=60, metadata=(("authorization", f"Bearer {API_KEY}"),)).embeddings[0]


def export_tiny_bert(root: Path, tokenizer, layers: int, heads: int, positions: int, spread: float = 0.02) -> Path:
    """A random BERT of `layers` x `heads` with `tokenizer`, its weights drawn with standard deviation `spread`,
    exported as `attnserve export` does (the variants the explorer serves)."""
    import torch
    import transformers

    from attnserve.export.artifacts import build_artifacts
    from attnserve.model.checkpoint import read_checkpoint

    config = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=16 * heads, num_hidden_layers=layers,
                                     num_attention_heads=heads, intermediate_size=64,
                                     max_position_embeddings=positions, initializer_range=spread)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(root / "model", safe_serialization=True)
    tokenizer.save_pretrained(root / "model")
    checkpoint = save_sentence_transformer(root / "model", root / "st", max_seq_length=positions)
    build_artifacts(read_checkpoint(checkpoint, root.name), root / "artifacts", log=lambda m: None,
                    variants=["embeddings", "embeddings_fused", "attention", "attention_last"])
    return root / "artifacts"


@pytest.fixture(scope="module")
def keyed(artifacts, clip_artifacts, tmp_path_factory):
    """One server, with an API key, of every model the page is tried on: MiniLM; "other", MiniLM's word pieces,
    layers and heads with other (random) weights; "tiny", 2 layers of 2 heads at 512 positions (MiniLM serves 256);
    and the tiny CLIP, an image-text model."""
    import transformers

    from attnserve.default_model import default_checkpoint_dir

    root = tmp_path_factory.mktemp("explorer-models")
    tiny_vocab = transformers.AutoTokenizer.from_pretrained(str(save_tiny_bert(root / "tiny-vocab")))
    # drawn wider than transformers' default (0.02), so that its maps are not uniform
    tiny = export_tiny_bert(root / "tiny", tiny_vocab, layers=2, heads=2, positions=512, spread=0.3)
    minilm_vocab = transformers.AutoTokenizer.from_pretrained(str(default_checkpoint_dir()))
    other = export_tiny_bert(root / "other", minilm_vocab, layers=6, heads=12, positions=64)
    models = {"minilm": artifacts, "other": other, "tiny": tiny, "clip": clip_artifacts}
    process = ServerProcess(None, *(f"--model={name}={folder}" for name, folder in models.items()),
                            "--api-key", API_KEY, log_path=root / "server.log")
    with serving(process):
        yield process


def open_with_key(driver, url: str, model: str) -> None:
    """The keyed server's page, its key typed (the models are listed with it) and `model` chosen."""
    open_page(driver, url)
    element(driver, "api-key").send_keys(API_KEY)
    element(driver, "text").click()  # the key field's change
    wait_for(driver, "document.getElementById('model').value === 'minilm'")
    idle(driver)
    select(driver, "model", model)
    assert not element(driver, "error").is_displayed(), element(driver, "error").text


# --- serving the page --------------------------------------------------------------------------------------------

def test_the_page_is_served_and_a_browser_at_the_root_is_sent_to_it(server):
    page = httpx.get(f"{server.http_url}/explorer", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    # self-contained: no script, style sheet or image from anywhere, and only inline code the policy names
    assert "<script src" not in page.text and "<link rel=\"stylesheet\"" not in page.text
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy and "unsafe-inline" not in policy
    assert httpx.head(f"{server.http_url}/explorer", timeout=30).status_code == 200
    browser_like = httpx.get(f"{server.http_url}/", headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"},
                             timeout=30)
    assert browser_like.status_code == 302
    assert httpx.URL(f"{server.http_url}/").join(browser_like.headers["location"]).path == "/explorer"
    curl_like = httpx.get(f"{server.http_url}/", timeout=30)  # Accept: */*
    assert curl_like.status_code == 200 and "GET /explorer" in curl_like.json()["routes"]


# --- the views ---------------------------------------------------------------------------------------------------

def test_the_heatmap_shows_the_served_weights_under_each_word_piece_and_downloads_as_png_svg_and_html(
        browser, server, stub, downloads, tmp_path, shots):
    open_page(browser, server.http_url)
    show(browser, TEXT, typed=True)
    reply = grpc_attention(stub, pb.Input(text=TEXT), layers=[-1])
    tokens, weights = list(reply.tokens), as_array(reply.attentions)[0]  # [heads, T, T] of the last layer
    info = js(browser, "window.explorer.heatmapInfo()")
    assert info["rowLabels"] == info["colLabels"] == tokens and info["rows"] == info["cols"] == len(tokens)
    assert info["layer"] == 5 and info["head"] == "mean" and info["cell"] >= 8
    T = len(tokens)
    for row, col in [(0, 0), (3, 5), (T - 1, 1)]:  # the heads' mean
        mean = weights[:, row, col].astype(np.float64).mean()
        assert hover_cell(browser, row, col) == pytest.approx((row, col, mean), abs=1e-6)
    change(browser, "head", "3")
    for row, col in [(0, 0), (2, 7), (T - 1, T - 1), (5, 0)]:
        assert hover_cell(browser, row, col) == pytest.approx((row, col, weights[3, row, col]), abs=1e-6)
    readout = element(browser, "hover").text
    assert f"“{tokens[5]}”" in readout and f"“{tokens[0]}”" in readout
    screenshot(browser, shots, "heatmap")
    for scale in ("row", "log"):  # the other scales draw the same cells and values
        change(browser, "scale", scale)
        assert hover_cell(browser, 2, 7)[2] == pytest.approx(weights[3, 2, 7], abs=1e-6)
    screenshot(browser, shots, "heatmap-log")

    # the downloads: the map as PNG and SVG, and a standalone page
    png = js(browser, "window.explorer.png()")
    assert png.startswith("data:image/png;base64,")
    assert base64.b64decode(png.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    svg = ET.fromstring(js(browser, "window.explorer.svg()"))
    ns = "{http://www.w3.org/2000/svg}"
    cells = svg.find(f"{ns}g[@shape-rendering='crispEdges']")  # the map's group: a <rect> per cell
    assert len(cells) == T * T and {(r.get("width"), r.get("height")) for r in cells} == {(str(info["cell"]),) * 2}
    assert [t.text for t in svg.iter(f"{ns}text")][:T] == info["rowLabels"]
    element(browser, "download-svg").click()  # the button saves the same drawing
    deadline = time.monotonic() + 10
    while not list(downloads.glob("attention-layer5-head3.svg")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (downloads / "attention-layer5-head3.svg").read_text() == js(browser, "window.explorer.svg()")

    html = browser.execute_async_script("const done = arguments[arguments.length - 1];"
                                        "window.explorer.standaloneHTML().then(done, (e) => done('failed: ' + e));")
    assert html.startswith("<!DOCTYPE html>") and "window.ATTNSERVE_DATA" in html
    file = tmp_path / "from-the-page.html"
    file.write_text(html, encoding="utf-8")
    layer_1 = as_array(grpc_attention(stub, pb.Input(text=TEXT), layers=[1]).attentions)[0]
    _check_standalone(browser, file, tokens, layer=1, head=7, expected=layer_1[7])
    screenshot(browser, shots, "standalone-from-page")
    assert page_errors(browser) == []


def test_toggling_a_head_and_hovering_a_token_change_the_head_view(browser, server, shots):
    open_page(browser, server.http_url)
    show(browser, TEXT)
    tab(browser, "headview")
    everything = wait_for(browser, "window.explorer.headViewState()")
    assert everything["activeHeads"] == list(range(12)) and everything["lines"] > 0
    screenshot(browser, shots, "headview")
    element(browser, "head-toggle-3").click()
    without_3 = js(browser, "window.explorer.headViewState()")
    assert 3 not in without_3["activeHeads"] and len(without_3["activeHeads"]) == 11
    assert 0 < without_3["lines"] < everything["lines"]
    element(browser, "head-toggle-none").click()
    assert js(browser, "window.explorer.headViewState()")["lines"] == 0
    element(browser, "head-toggle-all").click()
    assert js(browser, "window.explorer.headViewState()")["lines"] == everything["lines"]
    js(browser, "arguments[0].scrollIntoView({block: 'center'})", element(browser, "headview"))
    centre = js(browser, "window.explorer.headViewTokenCenter('left', 2)")
    point_at(browser, centre["x"], centre["y"])
    focused = js(browser, "window.explorer.headViewState()")
    assert focused["focus"] == {"side": "left", "index": 2}
    assert 0 < focused["lines"] <= 12 * len(js(browser, "window.explorer.state().tokens"))
    screenshot(browser, shots, "headview-token")
    assert page_errors(browser) == []


def test_the_model_view_shows_every_layer_and_head_and_opens_one_in_the_heatmap(browser, server, stub, shots):
    from selenium.webdriver.common.by import By

    open_page(browser, server.http_url)
    show(browser, TEXT)
    tab(browser, "modelview")
    thumbs = browser.find_elements(By.CSS_SELECTOR, "#modelview canvas.thumb")
    assert len(thumbs) == 6 * 12
    assert {(int(t.get_attribute("data-layer")), int(t.get_attribute("data-head"))) for t in thumbs} == {
        (layer, head) for layer in range(6) for head in range(12)}
    assert all(t.get_attribute("data-drawn") == "true" for t in thumbs)
    screenshot(browser, shots, "modelview")
    before = drawn(browser)
    browser.find_element(By.CSS_SELECTOR, '#modelview canvas.thumb[data-layer="2"][data-head="5"]').click()
    wait_for(browser, f"window.explorer.heatmapInfo().drawCount > {before}")
    idle(browser)
    info = js(browser, "window.explorer.heatmapInfo()")
    assert (info["layer"], info["head"], js(browser, "window.explorer.state().tab")) == (2, 5, "heatmap")
    assert (element(browser, "layer").get_attribute("value"), element(browser, "head").get_attribute("value")) == (
        "2", "5")
    weights = as_array(grpc_attention(stub, pb.Input(text=TEXT), layers=[2]).attentions)[0]
    assert hover_cell(browser, 4, 1) == pytest.approx((4, 1, weights[5, 4, 1]), abs=1e-6)
    assert page_errors(browser) == []


def test_rollout_norms_and_head_statistics_show_the_servers_analyses_with_their_legends(browser, server, stub, shots):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    open_page(browser, server.http_url)
    show(browser, *PAIR)
    item = pb.Input(pair=pb.TextPair(a=PAIR[0], b=PAIR[1]))
    reply = grpc_attention(stub, item, layers=[-1], analyses=["rollout", "head_stats", "norms"])
    tokens = list(reply.tokens)
    assert js(browser, "window.explorer.heatmapInfo().rowLabels") == tokens and reply.HasField("pair_start")

    tab(browser, "rollout")
    rollout = as_array(reply.analyses.rollout)
    assert js(browser, "window.explorer.mapInfo('rollout').rowLabels") == tokens
    assert hover_cell(browser, 3, 0, "rollout", "hover-rollout") == pytest.approx((3, 0, rollout[3, 0]), abs=1e-6)
    legend = element(browser, "panel-rollout").text
    assert "Abnar & Zuidema, 2020" in legend and "Quantifying Attention Flow in Transformers" in legend
    screenshot(browser, shots, "rollout")

    select(browser, "head", "3")
    tab(browser, "norms")
    norms, summed = as_array(reply.analyses.norms)[0], as_array(reply.analyses.norms_summed)[0]
    assert hover_cell(browser, 1, 2, "norms-head", "hover-norms-head") == pytest.approx(
        (1, 2, norms[3, 1, 2]), rel=1e-6)
    assert hover_cell(browser, 2, 0, "norms-summed", "hover-norms-summed") == pytest.approx(
        (2, 0, summed[2, 0]), rel=1e-6)
    legend = element(browser, "panel-norms").text
    assert "Kobayashi et al., EMNLP 2020" in legend and "Attention is not only a weight" in legend
    screenshot(browser, shots, "norms", at="tabs")

    tab(browser, "stats")
    names = [f.get_attribute("id").removeprefix("stat-")
             for f in browser.find_elements(By.CSS_SELECTOR, "#stats figure.stat")]
    assert set(names) == set(reply.analyses.head_stats) and {"entropy", "a_to_b", "b_to_a"} <= set(names)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#stat-entropy td.stat-cell")) == 6 * 12
    cell = browser.find_element(By.CSS_SELECTOR, '#stat-entropy td.stat-cell[data-layer="1"][data-head="2"]')
    js(browser, "arguments[0].scrollIntoView({block: 'center'})", cell)
    ActionChains(browser).move_to_element(cell).perform()
    readout = element(browser, "hover-stats")
    entropy = as_array(reply.analyses.head_stats["entropy"])
    assert float(readout.get_attribute("data-value")) == pytest.approx(entropy[1, 2], rel=1e-6)
    assert readout.text.startswith("entropy, layer 1, head 2:")
    assert "docs/attention.md" in element(browser, "panel-stats").text
    screenshot(browser, shots, "stats", at="tabs")
    assert page_errors(browser) == []


def test_compare_shows_both_maps_on_one_scale_and_their_difference_when_the_lengths_match(browser, server, stub,
                                                                                          shots):
    open_page(browser, server.http_url)
    show(browser, TEXT)
    select(browser, "head", "3")
    tab(browser, "compare")
    js(browser, "arguments[0].value = arguments[1]", element(browser, "compare-text"), SAME_LENGTH)
    element(browser, "compare-show").click()
    wait_for(browser, "window.explorer.mapInfo('compare-diff')")
    idle(browser)
    a, b = (grpc_attention(stub, pb.Input(text=text), layers=[-1]) for text in (TEXT, SAME_LENGTH))
    wa, wb = as_array(a.attentions)[0, 3], as_array(b.attentions)[0, 3]
    assert js(browser, "window.explorer.mapInfo('compare-a').rowLabels") == list(a.tokens)
    assert js(browser, "window.explorer.mapInfo('compare-b').rowLabels") == list(b.tokens)
    assert element(browser, "compare-diff-figure").is_displayed()
    assert hover_cell(browser, 2, 3, "compare-b", "hover-compare-b")[2] == pytest.approx(wb[2, 3], abs=1e-6)
    assert hover_cell(browser, 2, 3, "compare-diff", "hover-compare-diff")[2] == pytest.approx(
        float(wa[2, 3]) - float(wb[2, 3]), abs=1e-6)
    screenshot(browser, shots, "compare", at="tabs")

    js(browser, "arguments[0].value = arguments[1]", element(browser, "compare-text"), LONGER)
    before = drawn(browser, "compare-b")
    element(browser, "compare-show").click()
    wait_for(browser, f"window.explorer.mapInfo('compare-b').drawCount > {before}")
    idle(browser)
    longer = len(grpc_attention(stub, pb.Input(text=LONGER), layers=[-1]).tokens)
    assert not element(browser, "compare-diff-figure").is_displayed()
    assert element(browser, "compare-note").text == (
        f"No difference map: the left input has {len(a.tokens)} word pieces and the right {longer}; a difference "
        "needs the same number of rows and columns.")
    screenshot(browser, shots, "compare-lengths", at="tabs")
    assert page_errors(browser) == []


def test_compare_shows_one_text_under_two_served_models_on_one_scale_and_their_difference(browser, keyed,
                                                                                          shots):
    open_with_key(browser, keyed.http_url, "minilm")
    assert js(browser, "[...document.getElementById('compare-model').options].map((o) => o.value)") == [
        "minilm", "other", "tiny", "clip"]
    show(browser, TEXT)
    change(browser, "head", "3")
    tab(browser, "compare")
    js(browser, "arguments[0].value = ''", element(browser, "compare-text"))  # empty: the same text
    select(browser, "compare-model", "other")
    element(browser, "compare-show").click()
    wait_for(browser, "window.explorer.mapInfo('compare-diff')")
    idle(browser)
    with keyed.channel() as channel:
        a, b = (grpc_attention(keyed.stub(channel), pb.Input(text=TEXT), [-1], model=model)
                for model in ("minilm", "other"))
    wa, wb = as_array(a.attentions)[0, 3], as_array(b.attentions)[0, 3]  # the last layer's head 3, (T, T) each
    assert list(a.tokens) == list(b.tokens)  # one tokenizer: the maps' rows and columns are the same word pieces
    assert np.abs(wa - wb).max() > 1e-3  # other weights: other maps
    left, right, diff = (js(browser, "window.explorer.mapInfo(arguments[0])", name)
                         for name in ("compare-a", "compare-b", "compare-diff"))
    assert left["rowLabels"] == right["rowLabels"] == diff["rowLabels"] == list(a.tokens)
    assert left["scale"] == right["scale"] == {"kind": "fixed", "hi": 1}  # side by side on one scale
    assert diff["scale"]["kind"] == "diverging"
    assert element(browser, "compare-a-caption").text.startswith("minilm: ")
    assert element(browser, "compare-b-caption").text.startswith("other: ")
    assert element(browser, "compare-diff-figure").is_displayed() and element(browser, "compare-note").text == ""
    T = len(a.tokens)
    for row, col in [(0, 0), (2, 3), (T - 1, 1), (4, T - 1)]:
        assert hover_cell(browser, row, col, "compare-a", "hover-compare-a") == pytest.approx(
            (row, col, wa[row, col]), abs=1e-6)
        assert hover_cell(browser, row, col, "compare-b", "hover-compare-b") == pytest.approx(
            (row, col, wb[row, col]), abs=1e-6)
        assert hover_cell(browser, row, col, "compare-diff", "hover-compare-diff") == pytest.approx(
            (row, col, float(wa[row, col]) - float(wb[row, col])), abs=1e-6)
    screenshot(browser, shots, "compare-models", at="tabs")
    assert page_errors(browser) == []


def test_compare_across_models_of_different_depth_pairs_layers_at_the_same_relative_depth_and_says_so(
        browser, keyed, shots):
    open_with_key(browser, keyed.http_url, "minilm")
    show(browser, TEXT)  # the last layer, 5 of MiniLM's 6
    if element(browser, "head").get_attribute("value") != "mean":  # a new page shows the heads' mean
        change(browser, "head", "mean")
    tab(browser, "compare")
    js(browser, "arguments[0].value = ''", element(browser, "compare-text"))
    select(browser, "compare-model", "tiny")
    with keyed.channel() as channel:
        def maps(model: str, layer: int) -> np.ndarray:  # the heads' mean of one layer, (T, T)
            reply = grpc_attention(keyed.stub(channel), pb.Input(text=TEXT), [layer], model=model)
            return as_array(reply.attentions)[0].astype(np.float64).mean(0)

        for layer_a, layer_b in [("5", 1), ("1", 0), ("0", 0), ("3", 1)]:  # round(l * 1 / 5)
            if layer_a != "5":
                change(browser, "layer", layer_a, name="compare-b")
            else:
                element(browser, "compare-show").click()
                wait_for(browser, "window.explorer.mapInfo('compare-b')")
                idle(browser)
            right = js(browser, "window.explorer.mapInfo('compare-b')")
            expected = maps("tiny", layer_b)
            T = expected.shape[0]
            assert right["rows"] == T
            for row, col in [(0, 0), (T - 1, 1)]:
                assert hover_cell(browser, row, col, "compare-b", "hover-compare-b") == pytest.approx(
                    (row, col, expected[row, col]), abs=1e-6)
            last = " (last)" if layer_b == 1 else ""
            assert f"layer {layer_b} of 0..1{last}, mean of heads" in element(browser, "compare-b-caption").text
            assert element(browser, "compare-a-caption").text.startswith("minilm: ")
            assert (f"The models differ in depth (6 and 2 layers): layer {layer_a} is compared with layer {layer_b}, "
                    "at the same relative depth.") in element(browser, "compare-note").text
    screenshot(browser, shots, "compare-depths", at="tabs")
    # A head the shallower model lacks (it has 2): said, not drawn from another head.
    select(browser, "head", "3")  # the compare tab redraws for it
    wait_for(browser, "document.getElementById('error').textContent.includes('no head 3')")
    assert element(browser, "error").text == ("tiny has 2 heads, no head 3: choose a head both models have, or the "
                                              "mean of heads")
    assert page_errors(browser) == []


def _check_standalone(browser, file: Path, tokens: list[str], layer: int, head: int, expected: np.ndarray) -> None:
    browser.get(file.as_uri())
    wait_for(browser, "window.explorer && window.explorer.heatmapInfo()")
    idle(browser)
    state = js(browser, "window.explorer.state()")
    assert state["mode"] == "standalone" and state["requests"] == 0 and state["tokens"] == tokens
    assert js(browser, "window.explorer.heatmapInfo().rowLabels") == tokens
    assert not any(element(browser, id_).is_displayed() for id_ in SERVER_ONLY)
    select(browser, "layer", str(layer))
    change(browser, "head", str(head))
    assert hover_cell(browser, 1, 3) == pytest.approx((1, 3, expected[1, 3]), abs=1e-6)
    assert js(browser, "window.explorer.state().requests") == 0


def test_the_standalone_html_opens_from_a_file_with_no_server(browser, server, stub, tmp_path, shots):
    reply = httpx.post(f"{server.http_url}/v1/attention", json={
        "inputs": TEXT, "layers": list(range(6)), "analyses": ["rollout", "head_stats", "norms"]}, timeout=60).json()
    file = tmp_path / "attention.html"
    file.write_text(standalone_html(reply), encoding="utf-8")
    item = grpc_attention(stub, pb.Input(text=TEXT), layers=[4])
    _check_standalone(browser, file, list(item.tokens), layer=4, head=2, expected=as_array(item.attentions)[0, 2])
    screenshot(browser, shots, "standalone")
    tab(browser, "rollout")
    assert js(browser, "window.explorer.mapInfo('rollout').rows") == len(item.tokens)
    tab(browser, "norms")
    assert js(browser, "window.explorer.mapInfo('norms-summed').rows") == len(item.tokens)
    tab(browser, "modelview")
    assert js(browser, "document.querySelectorAll('#modelview canvas.thumb[data-drawn]').length") == 6 * 12
    assert js(browser, "window.explorer.state().requests") == 0
    assert page_errors(browser) == []


def _tiny_reply(tokens: list[str]) -> dict:
    """A hand-made reply of one layer and one head, its weights as nested lists."""
    T = len(tokens)
    return {"object": "list", "model": "m", "data": [{
        "index": 0, "tokens": tokens, "num_tokens": T, "truncated": False, "layers": [0], "heads": [0],
        "shape": [1, 1, T, T], "attentions": np.full((1, 1, T, T), 1 / T, dtype=np.float32).tolist()}]}


def test_the_standalone_html_keeps_a_word_piece_that_would_close_its_script(browser, tmp_path):
    tokens = ["[CLS]", "</script><script>window.pwned = 1</script>", "<!--", "[SEP]"]
    file = tmp_path / "hostile.html"
    file.write_text(standalone_html(_tiny_reply(tokens)), encoding="utf-8")
    browser.get(file.as_uri())
    wait_for(browser, "window.explorer && window.explorer.heatmapInfo()")
    assert js(browser, "window.explorer.heatmapInfo().rowLabels") == tokens
    assert js(browser, "window.pwned") is None


def test_a_standalone_html_of_what_it_cannot_show_is_refused_in_words():
    reply = _tiny_reply(["[CLS]", "a", "[SEP]"])
    item = reply["data"][0]
    with pytest.raises(ValueError, match="shows one input; this reply has 2 items"):
        standalone_html({**reply, "data": [item, item]})
    with pytest.raises(ValueError, match="weights false"):
        standalone_html({**reply, "data": [{**item, "attentions": None}]})
    with pytest.raises(ValueError, match="averages its heads"):
        standalone_html({**reply, "data": [{**item, "heads": [0, 1]}]})


# --- API keys and long inputs ------------------------------------------------------------------------------------

def _message(reply: httpx.Response) -> str:
    return reply.json()["error"]["message"]


def test_a_missing_or_wrong_api_key_shows_the_servers_message(browser, keyed, shots):
    open_page(browser, keyed.http_url)
    no_key = _message(httpx.get(f"{keyed.http_url}/v1/models", timeout=30))
    assert element(browser, "error").text == no_key  # the models' list was refused
    wrong = httpx.post(f"{keyed.http_url}/v1/attention", json={"inputs": TEXT, "truncate": True},
                       headers={"Authorization": "Bearer wrong"}, timeout=30)
    assert wrong.status_code == 401
    element(browser, "api-key").send_keys("wrong")
    js(browser, "arguments[0].value = arguments[1]", element(browser, "text"), TEXT)
    element(browser, "show").click()
    wait_for(browser, "document.getElementById('error').textContent === arguments[0]", 30, _message(wrong))
    idle(browser)
    assert element(browser, "error").is_displayed()
    screenshot(browser, shots, "wrong-key")
    assert js(browser, "window.explorer.state().errors") == []


def test_a_512_token_input_is_drawn_within_3_seconds(browser, keyed, shots):
    open_with_key(browser, keyed.http_url, "tiny")
    long_text = " ".join(string.ascii_lowercase[i % 26] for i in range(600))  # 602 word pieces, cut at 512
    js(browser, "arguments[0].value = arguments[1]", element(browser, "text"), long_text)
    before = drawn(browser)
    start = time.perf_counter()
    element(browser, "show").click()
    wait_for(browser, f"window.explorer.heatmapInfo() && window.explorer.heatmapInfo().drawCount > {before}", 10)
    seconds = time.perf_counter() - start
    info = js(browser, "window.explorer.heatmapInfo()")
    assert info["rows"] == info["cols"] == 512 and info["cell"] >= 1
    print(f"512 tokens: drawn {seconds:.2f} s after Show (the page measured {info['drawnMs']:.0f} ms)")
    assert seconds < 3, f"a 512-token map took {seconds:.2f} s to draw"
    idle(browser)
    assert "(cut at max_seq_length)" in element(browser, "status").text
    change(browser, "scale", "log")  # a random model's weights near 1/512: the log scale shows them apart
    screenshot(browser, shots, "512-tokens")
    # the key goes with every request: the model view's (a layer each) and the norms' too
    tab(browser, "modelview")
    assert js(browser, "document.querySelectorAll('#modelview canvas.thumb[data-drawn]').length") == 2 * 2
    tab(browser, "norms")
    assert js(browser, "window.explorer.mapInfo('norms-summed').rows") == 512
    assert not element(browser, "error").is_displayed(), element(browser, "error").text
    assert page_errors(browser) == []


# --- an image's attention over its patches (an image-text model's) ----------------------------------------------

@pytest.fixture(scope="module")
def picture(tmp_path_factory) -> Path:
    """A 60 x 40 JPEG: wider than tall, so the model sees its centre square (CLIP's crop)."""
    from PIL import Image

    path = tmp_path_factory.mktemp("pictures") / "wide.jpg"
    rng = np.random.default_rng(7)
    Image.fromarray((rng.random((40, 60, 3)) * 255).astype(np.uint8)).save(path, quality=95)
    return path


def test_the_image_tab_draws_the_class_tokens_map_and_rollout_over_the_picture(browser, keyed, picture, shots):
    from attnserve.patch_attention import patch_maps, patch_rollout

    open_with_key(browser, keyed.http_url, "clip")
    element(browser, "image-file").send_keys(str(picture))
    element(browser, "show-image").click()
    wait_for(browser, "(window.explorer.imageInfo('map') && window.explorer.imageInfo('rollout')) || "
                      "!document.getElementById('error').hidden")
    idle(browser)
    assert not element(browser, "error").is_displayed(), element(browser, "error").text
    assert js(browser, "window.explorer.state().tab") == "image"
    with keyed.channel() as channel:  # the server's own maps of the same image, over gRPC
        served = grpc_attention(keyed.stub(channel), pb.Input(image=pb.Image(data=picture.read_bytes())), [0, 1],
                                ["rollout"], model="clip")
    maps, rollout = as_array(served.attentions), as_array(served.analyses.rollout)  # (L, nh, T, T), (T, T)
    shown = js(browser, "window.explorer.imageInfo('map')")
    assert (shown["rows"], shown["cols"], shown["g"], shown["fit"]) == (4, 4, 4, "crop")
    assert (shown["width"], shown["height"]) == (360, 360)  # the model's centre square
    assert np.allclose(shown["grid"], patch_maps(maps, True)[1].mean(axis=0).ravel(), atol=1e-6)  # the last layer
    assert np.allclose(js(browser, "window.explorer.imageInfo('rollout')")["grid"],
                       patch_rollout(maps, True).ravel(), atol=1e-5)
    assert rollout.shape == (17, 17)
    select(browser, "image-layer", "0")
    select(browser, "image-head", "2")
    wait_for(browser, "document.getElementById('image-map-caption').textContent.startsWith('layer 0, head 2')")
    idle(browser)
    assert np.allclose(js(browser, "window.explorer.imageInfo('map')")["grid"], patch_maps(maps, True)[0, 2].ravel(),
                       atol=1e-6)
    js(browser, "arguments[0].scrollIntoView({block: 'center'})", element(browser, "image-map"))
    centre = js(browser, "window.explorer.imagePatchCenter('map', 1, 2)")
    point_at(browser, 1, 1)
    point_at(browser, centre["x"], centre["y"])
    assert element(browser, "hover-image-map").text.startswith("patch 1,2: ")
    screenshot(browser, shots, "image", at="tabs")
    assert page_errors(browser) == []


# A NaFlex image's 3 x 5 patches, drawn by the page's own ImageView on a canvas of its own (no served model has a
# NaFlex tower here, the server's rows and cols are tests/test_image_serving.py's): a black 50 x 20 picture
# stretched to the grid's 5:3 (360 x 216 px), one bright patch (row 1's last), hovered for its label.
NAFLEX_DRAW = """
const done = arguments[arguments.length - 1];
const ns = window.attnserveExplorer, source = document.createElement("canvas");
source.width = 50; source.height = 20;
source.getContext("2d").fillRect(0, 0, 50, 20);
const picture = new Image();
picture.src = source.toDataURL("image/png");
picture.decode().then(() => {
  const canvas = document.createElement("canvas"), hover = document.createElement("p");
  canvas.id = "naflex-test"; hover.id = "naflex-test-hover";
  document.body.append(canvas, hover);
  const view = new ns.ImageView(canvas, hover);
  const grid = new Float64Array(15);
  grid[9] = 1;
  view.draw(picture, grid, 3, 5, "patches", "max");
  window.naflexView = view;
  const ctx = canvas.getContext("2d"), centres = [];
  for (let r = 0; r < 3; r++) for (let c = 0; c < 5; c++) {
    const [red, green, blue] = ctx.getImageData((c + 0.5) * 72, (r + 0.5) * 72, 1, 1).data;
    centres.push(red + green + blue);
  }
  done({ info: view.info(), width: canvas.width, height: canvas.height, centres });
});
"""


def test_the_image_view_draws_a_rows_by_cols_grid(browser, server):
    open_page(browser, server.http_url)
    drawn = browser.execute_async_script(NAFLEX_DRAW)
    info = drawn["info"]
    assert (info["rows"], info["cols"], info["g"], info["fit"]) == (3, 5, None, "patches")
    assert (drawn["width"], drawn["height"]) == (info["width"], info["height"]) == (360, 216)  # 5:3, 72 px a patch
    centres = drawn["centres"]  # each patch's centre, row-major: only patch 9 (row 1, column 4) is bright
    assert int(np.argmax(centres)) == 9 and len(set(centres[:9] + centres[10:])) == 1
    js(browser, "arguments[0].scrollIntoView({block: 'center'})", element(browser, "naflex-test"))
    centre = js(browser, "window.naflexView.patchCenter(1, 4)")
    point_at(browser, 1, 1)
    point_at(browser, centre["x"], centre["y"])
    label, value = element(browser, "naflex-test-hover").text.split(": ")
    assert label == "patch 1,4" and float(value) == 1.0
    centre = js(browser, "window.naflexView.patchCenter(2, 0)")
    point_at(browser, centre["x"], centre["y"])
    label, value = element(browser, "naflex-test-hover").text.split(": ")
    assert label == "patch 2,0" and float(value) == 0.0
    assert page_errors(browser) == []


def test_an_image_for_a_text_model_is_refused_on_the_page(browser, server, picture):
    open_page(browser, server.http_url)
    element(browser, "image-file").send_keys(str(picture))
    element(browser, "show-image").click()
    wait_for(browser, "!document.getElementById('error').hidden")
    idle(browser)
    assert "is a text model" in element(browser, "error").text
    assert js(browser, "window.explorer.state().errors") == []
