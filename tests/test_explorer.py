"""The attention explorer (GET /explorer) in Debian's headless Chromium, driven by Selenium against real servers:
every number a view shows is held to the same server's gRPC reply. Screenshots go to ATTNSERVE_TEST_SCREENSHOTS (else
a temporary folder), to look at. Without Chromium and chromedriver the tests skip, and under CI they fail."""

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
from .test_attention_analyses import as_array

TEXT = "The cat sat on the mat because it was tired."
SAME_LENGTH = "The dog sat on the rug because it was tired."  # as many word pieces as TEXT
LONGER = "A much longer sentence, with quite a few more word pieces than the first one had."
PAIR = ("Where does the cat sleep?", "The cat sleeps on the warm mat.")
API_KEY = "explorer-test-key"
SERVER_ONLY = ["model", "api-key", "text", "text-b", "show", "download-html", "tab-compare"]
THUMBS = "document.querySelectorAll('#modelview canvas.thumb[data-drawn]').length"


# --- the browser -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Its downloads go to browser.downloads, its screenshots to browser.shots."""
    def unavailable(reason: str):
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: CI must run the explorer's browser tests (.ci/run installs Debian's chromium)")
        pytest.skip(reason)

    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        unavailable("selenium is not installed (pip install -e '.[dev]')")
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not chromedriver:
        unavailable("no chromium and chromedriver on PATH (apt-get install chromium chromium-driver)")
    options = Options()
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1200",
                     "--force-device-scale-factor=1"):
        options.add_argument(argument)
    options.binary_location = chromium
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    downloads = tmp_path_factory.mktemp("downloads")
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                              "download.prompt_for_download": False})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
    driver.downloads = downloads
    driver.shots = Path(os.environ.get("ATTNSERVE_TEST_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    driver.shots.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


def js(driver, script: str, *args):
    return driver.execute_script(f"return {script}", *args)


def wait_for(driver, condition: str, *args, timeout: float = 30):
    """Until the JavaScript expression `condition` is truthy, then until the page is idle; its value."""
    from selenium.webdriver.support.ui import WebDriverWait

    value = WebDriverWait(driver, timeout, poll_frequency=0.02).until(lambda d: js(d, condition, *args))
    WebDriverWait(driver, timeout, poll_frequency=0.02).until(
        lambda d: js(d, "window.explorer && window.explorer.state().busy === 0"))
    return value


def element(driver, id_: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, id_)


def select(driver, id_: str, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(element(driver, id_)).select_by_value(value)


def set_text(driver, id_: str, text: str) -> None:
    js(driver, "arguments[0].value = arguments[1]", element(driver, id_), text)


def page_errors(driver) -> list[str]:
    """The page's own failures, and the console's errors but for the HTTP refusals a test provokes."""
    console = [e["message"] for e in driver.get_log("browser")
               if e["level"] == "SEVERE" and "Failed to load resource" not in e["message"]]
    return js(driver, "window.explorer.state().errors") + console


def open_page(driver, url: str) -> None:
    driver.get(f"{url}/explorer")
    wait_for(driver, "window.explorer !== undefined")


def drawn(driver, name: str = "heatmap") -> int:
    info = js(driver, "window.explorer.mapInfo(arguments[0])", name)
    return info["drawCount"] if info else 0


def click_until_drawn(driver, button: str, name: str = "heatmap") -> None:
    before = drawn(driver, name)
    element(driver, button).click()
    wait_for(driver, f"window.explorer.mapInfo('{name}') && window.explorer.mapInfo('{name}').drawCount > {before}")


def show(driver, text: str, text_b: str = "", typed: bool = False) -> None:
    """Text (and segment b) in, Show pressed, until the heatmap is drawn anew."""
    if typed:
        element(driver, "text").clear()
        element(driver, "text").send_keys(text)
    else:
        set_text(driver, "text", text)
    set_text(driver, "text-b", text_b)
    click_until_drawn(driver, "show")


def change(driver, id_: str, value: str, name: str = "heatmap") -> None:
    before = drawn(driver, name)
    select(driver, id_, value)
    wait_for(driver, f"window.explorer.mapInfo('{name}').drawCount > {before}")


def point_at(driver, x: float, y: float) -> None:
    """A real pointer move (WebDriver actions) to client coordinates, from elsewhere: a move to where the pointer
    already is need not be an event."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    for to in ((1, 1), (x, y)):
        actions = ActionBuilder(driver)
        actions.pointer_action.move_to_location(round(to[0]), round(to[1]))
        actions.perform()


def point_at_element(driver, id_: str, centre: str, *args) -> None:
    js(driver, "arguments[0].scrollIntoView({block: 'center'})", element(driver, id_))
    where = js(driver, centre, *args)
    point_at(driver, where["x"], where["y"])


def hover_cell(driver, row: int, col: int, name: str = "heatmap") -> tuple[int, int, float]:
    """Points at a map's cell through its documented centre; what its readout then says (row, col, value)."""
    point_at_element(driver, name, "window.explorer.mapCellCenter(arguments[0], arguments[1], arguments[2])", name,
                     row, col)
    box = element(driver, "hover" if name == "heatmap" else f"hover-{name}")
    return (int(box.get_attribute("data-row")), int(box.get_attribute("data-col")),
            float(box.get_attribute("data-value")))


def assert_hovers(driver, name: str, cells: list[tuple[int, int]], expected: np.ndarray, **tolerance) -> None:
    for row, col in cells:
        assert hover_cell(driver, row, col, name) == pytest.approx((row, col, expected[row, col]),
                                                                    **(tolerance or {"abs": 1e-6}))


def tab(driver, name: str) -> None:
    element(driver, f"tab-{name}").click()
    wait_for(driver, "true")


def screenshot(driver, name: str, at: str | None = None) -> None:
    """The page from its top, or from the element `at` (the tabs, for a view taller than the window)."""
    if at:
        js(driver, "arguments[0].scrollIntoView()", element(driver, at))
    else:
        js(driver, "window.scrollTo(0, 0)")
    assert driver.save_screenshot(str(driver.shots / f"explorer-{name}.png"))


# --- the servers' own answers ------------------------------------------------------------------------------------

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
    select(driver, "model", model)
    assert not element(driver, "error").is_displayed(), element(driver, "error").text


# --- serving the page and its views ------------------------------------------------------------------------------

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


def test_the_heatmap_shows_the_served_weights_under_each_word_piece_and_downloads_as_png_svg_and_html(
        browser, server, stub, tmp_path):
    open_page(browser, server.http_url)
    show(browser, TEXT, typed=True)
    reply = grpc_attention(stub, pb.Input(text=TEXT), layers=[-1])
    tokens, weights = list(reply.tokens), as_array(reply.attentions)[0]  # [heads, T, T] of the last layer
    T = len(tokens)
    info = js(browser, "window.explorer.heatmapInfo()")
    assert info["rowLabels"] == info["colLabels"] == tokens and info["rows"] == info["cols"] == T
    assert info["layer"] == 5 and info["head"] == "mean" and info["cell"] >= 8
    assert_hovers(browser, "heatmap", [(0, 0), (3, 5), (T - 1, 1)], weights.astype(np.float64).mean(0))
    change(browser, "head", "3")
    assert_hovers(browser, "heatmap", [(0, 0), (2, 7), (T - 1, T - 1), (5, 0)], weights[3])
    readout = element(browser, "hover").text
    assert f"“{tokens[5]}”" in readout and f"“{tokens[0]}”" in readout
    screenshot(browser, "heatmap")
    for scale in ("row", "log"):  # the other scales draw the same cells and values
        change(browser, "scale", scale)
        assert_hovers(browser, "heatmap", [(2, 7)], weights[3])
    screenshot(browser, "heatmap-log")

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
    while not list(browser.downloads.glob("attention-layer5-head3.svg")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (browser.downloads / "attention-layer5-head3.svg").read_text() == js(browser, "window.explorer.svg()")
    html = browser.execute_async_script("const done = arguments[arguments.length - 1];"
                                        "window.explorer.standaloneHTML().then(done, (e) => done('failed: ' + e));")
    assert html.startswith("<!DOCTYPE html>") and "window.ATTNSERVE_DATA" in html
    file = tmp_path / "from-the-page.html"
    file.write_text(html, encoding="utf-8")
    layer_1 = as_array(grpc_attention(stub, pb.Input(text=TEXT), layers=[1]).attentions)[0]
    check_standalone(browser, file, tokens, layer=1, head=7, expected=layer_1[7])
    screenshot(browser, "standalone-from-page")
    assert page_errors(browser) == []


def test_the_head_view_toggles_heads_and_the_model_view_opens_a_layers_head_in_the_heatmap(browser, server, stub):
    from selenium.webdriver.common.by import By

    open_page(browser, server.http_url)
    show(browser, TEXT)
    tab(browser, "headview")
    everything = wait_for(browser, "window.explorer.headViewState()")
    assert everything["activeHeads"] == list(range(12)) and everything["lines"] > 0
    screenshot(browser, "headview")
    element(browser, "head-toggle-3").click()
    without_3 = js(browser, "window.explorer.headViewState()")
    assert 3 not in without_3["activeHeads"] and len(without_3["activeHeads"]) == 11
    assert 0 < without_3["lines"] < everything["lines"]
    element(browser, "head-toggle-none").click()
    assert js(browser, "window.explorer.headViewState()")["lines"] == 0
    element(browser, "head-toggle-all").click()
    assert js(browser, "window.explorer.headViewState()")["lines"] == everything["lines"]
    point_at_element(browser, "headview", "window.explorer.headViewTokenCenter('left', 2)")
    focused = js(browser, "window.explorer.headViewState()")
    assert focused["focus"] == {"side": "left", "index": 2}
    assert 0 < focused["lines"] <= 12 * len(js(browser, "window.explorer.state().tokens"))
    screenshot(browser, "headview-token")

    tab(browser, "modelview")
    thumbs = browser.find_elements(By.CSS_SELECTOR, "#modelview canvas.thumb")
    assert sorted((int(t.get_attribute("data-layer")), int(t.get_attribute("data-head"))) for t in thumbs) == [
        (layer, head) for layer in range(6) for head in range(12)]
    assert all(t.get_attribute("data-drawn") == "true" for t in thumbs)
    screenshot(browser, "modelview")
    before = drawn(browser)
    browser.find_element(By.CSS_SELECTOR, '#modelview canvas.thumb[data-layer="2"][data-head="5"]').click()
    wait_for(browser, f"window.explorer.heatmapInfo().drawCount > {before}")
    info = js(browser, "window.explorer.heatmapInfo()")
    assert (info["layer"], info["head"], js(browser, "window.explorer.state().tab")) == (2, 5, "heatmap")
    assert (element(browser, "layer").get_attribute("value"), element(browser, "head").get_attribute("value")) == (
        "2", "5")
    weights = as_array(grpc_attention(stub, pb.Input(text=TEXT), layers=[2]).attentions)[0]
    assert_hovers(browser, "heatmap", [(4, 1)], weights[5])
    assert page_errors(browser) == []


def test_rollout_norms_and_head_statistics_show_the_servers_analyses_with_their_legends(browser, server, stub):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    open_page(browser, server.http_url)
    show(browser, *PAIR)
    item = pb.Input(pair=pb.TextPair(a=PAIR[0], b=PAIR[1]))
    reply = grpc_attention(stub, item, layers=[-1], analyses=["rollout", "head_stats", "norms"])
    tokens = list(reply.tokens)
    assert js(browser, "window.explorer.heatmapInfo().rowLabels") == tokens and reply.HasField("pair_start")
    tab(browser, "rollout")
    assert js(browser, "window.explorer.mapInfo('rollout').rowLabels") == tokens
    assert_hovers(browser, "rollout", [(3, 0)], as_array(reply.analyses.rollout))
    legend = element(browser, "panel-rollout").text
    assert "Abnar & Zuidema, 2020" in legend and "Quantifying Attention Flow in Transformers" in legend
    screenshot(browser, "rollout")

    select(browser, "head", "3")
    tab(browser, "norms")
    assert_hovers(browser, "norms-head", [(1, 2)], as_array(reply.analyses.norms)[0, 3], rel=1e-6)
    assert_hovers(browser, "norms-summed", [(2, 0)], as_array(reply.analyses.norms_summed)[0], rel=1e-6)
    legend = element(browser, "panel-norms").text
    assert "Kobayashi et al., EMNLP 2020" in legend and "Attention is not only a weight" in legend
    screenshot(browser, "norms", at="tabs")

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
    screenshot(browser, "stats", at="tabs")
    assert page_errors(browser) == []


# --- the compare tab ---------------------------------------------------------------------------------------------

def compare(driver, text: str, model: str | None = None) -> dict[str, dict | None]:
    """The compare tab's right-hand input (text, "" for the same; a served model), shown: its maps' info."""
    tab(driver, "compare")
    set_text(driver, "compare-text", text)
    if model:
        select(driver, "compare-model", model)
    click_until_drawn(driver, "compare-show", "compare-b")
    return {name: js(driver, "window.explorer.mapInfo(arguments[0])", f"compare-{name}") for name in ("a", "b",
                                                                                                    "diff")}


def test_compare_shows_both_maps_on_one_scale_and_their_difference_when_the_lengths_match(browser, server, stub):
    open_page(browser, server.http_url)
    show(browser, TEXT)
    select(browser, "head", "3")
    maps = compare(browser, SAME_LENGTH)
    a, b = (grpc_attention(stub, pb.Input(text=text), layers=[-1]) for text in (TEXT, SAME_LENGTH))
    wa, wb = as_array(a.attentions)[0, 3], as_array(b.attentions)[0, 3]
    assert (maps["a"]["rowLabels"], maps["b"]["rowLabels"]) == (list(a.tokens), list(b.tokens))
    assert element(browser, "compare-diff-figure").is_displayed()
    assert_hovers(browser, "compare-b", [(2, 3)], wb)
    assert_hovers(browser, "compare-diff", [(2, 3)], wa.astype(np.float64) - wb)
    screenshot(browser, "compare", at="tabs")

    compare(browser, LONGER)
    longer = len(grpc_attention(stub, pb.Input(text=LONGER), layers=[-1]).tokens)
    assert not element(browser, "compare-diff-figure").is_displayed()
    assert element(browser, "compare-note").text == (
        f"No difference map: the left input has {len(a.tokens)} word pieces and the right {longer}; a difference "
        "needs the same number of rows and columns.")
    screenshot(browser, "compare-lengths", at="tabs")
    assert page_errors(browser) == []


def test_compare_shows_one_text_under_two_served_models_on_one_scale_and_their_difference(browser, keyed):
    open_with_key(browser, keyed.http_url, "minilm")
    assert js(browser, "[...document.getElementById('compare-model').options].map((o) => o.value)") == [
        "minilm", "other", "tiny", "clip"]
    show(browser, TEXT)
    change(browser, "head", "3")
    maps = compare(browser, "", "other")  # no text: the same one
    with keyed.channel() as channel:
        a, b = (grpc_attention(keyed.stub(channel), pb.Input(text=TEXT), [-1], model=model)
                for model in ("minilm", "other"))
    wa, wb = as_array(a.attentions)[0, 3], as_array(b.attentions)[0, 3]  # the last layer's head 3, (T, T) each
    assert list(a.tokens) == list(b.tokens)  # one tokenizer: the maps' rows and columns are the same word pieces
    assert np.abs(wa - wb).max() > 1e-3  # other weights: other maps
    assert maps["a"]["rowLabels"] == maps["b"]["rowLabels"] == maps["diff"]["rowLabels"] == list(a.tokens)
    assert maps["a"]["scale"] == maps["b"]["scale"] == {"kind": "fixed", "hi": 1}  # side by side on one scale
    assert maps["diff"]["scale"]["kind"] == "diverging"
    assert element(browser, "compare-a-caption").text.startswith("minilm: ")
    assert element(browser, "compare-b-caption").text.startswith("other: ")
    assert element(browser, "compare-diff-figure").is_displayed() and element(browser, "compare-note").text == ""
    T = len(a.tokens)
    for name, expected in (("compare-a", wa), ("compare-b", wb), ("compare-diff", wa.astype(np.float64) - wb)):
        assert_hovers(browser, name, [(0, 0), (2, 3), (T - 1, 1), (4, T - 1)], expected)
    screenshot(browser, "compare-models", at="tabs")
    assert page_errors(browser) == []


def test_compare_across_models_of_different_depth_pairs_layers_at_the_same_relative_depth_and_says_so(browser,
                                                                                                      keyed):
    open_with_key(browser, keyed.http_url, "minilm")
    show(browser, TEXT)  # the last layer, 5 of MiniLM's 6
    if element(browser, "head").get_attribute("value") != "mean":  # a new page shows the heads' mean
        change(browser, "head", "mean")
    compare(browser, "", "tiny")
    with keyed.channel() as channel:
        for layer_a, layer_b in [("5", 1), ("1", 0), ("0", 0), ("3", 1)]:  # round(l * 1 / 5)
            if layer_a != "5":
                change(browser, "layer", layer_a, name="compare-b")
            reply = grpc_attention(keyed.stub(channel), pb.Input(text=TEXT), [layer_b], model="tiny")
            expected = as_array(reply.attentions)[0].astype(np.float64).mean(0)  # the heads' mean, (T, T)
            T = expected.shape[0]
            assert js(browser, "window.explorer.mapInfo('compare-b')")["rows"] == T
            assert_hovers(browser, "compare-b", [(0, 0), (T - 1, 1)], expected)
            last = " (last)" if layer_b == 1 else ""
            assert f"layer {layer_b} of 0..1{last}, mean of heads" in element(browser, "compare-b-caption").text
            assert element(browser, "compare-a-caption").text.startswith("minilm: ")
            assert (f"The models differ in depth (6 and 2 layers): layer {layer_a} is compared with layer {layer_b}, "
                    "at the same relative depth.") in element(browser, "compare-note").text
    screenshot(browser, "compare-depths", at="tabs")
    # A head the shallower model lacks (it has 2): said, not drawn from another head.
    select(browser, "head", "3")  # the compare tab redraws for it
    wait_for(browser, "document.getElementById('error').textContent.includes('no head 3')")
    assert element(browser, "error").text == ("tiny has 2 heads, no head 3: choose a head both models have, or the "
                                              "mean of heads")
    assert page_errors(browser) == []


# --- the standalone file -----------------------------------------------------------------------------------------

def check_standalone(browser, file: Path, tokens: list[str], layer: int, head: int, expected: np.ndarray) -> None:
    browser.get(file.as_uri())
    wait_for(browser, "window.explorer && window.explorer.heatmapInfo()")
    state = js(browser, "window.explorer.state()")
    assert state["mode"] == "standalone" and state["requests"] == 0 and state["tokens"] == tokens
    assert js(browser, "window.explorer.heatmapInfo().rowLabels") == tokens
    assert not any(element(browser, id_).is_displayed() for id_ in SERVER_ONLY)
    select(browser, "layer", str(layer))
    change(browser, "head", str(head))
    assert_hovers(browser, "heatmap", [(1, 3)], expected)
    assert js(browser, "window.explorer.state().requests") == 0


def test_the_standalone_html_opens_from_a_file_with_no_server(browser, server, stub, tmp_path):
    reply = httpx.post(f"{server.http_url}/v1/attention", json={
        "inputs": TEXT, "layers": list(range(6)), "analyses": ["rollout", "head_stats", "norms"]}, timeout=60).json()
    file = tmp_path / "attention.html"
    file.write_text(standalone_html(reply), encoding="utf-8")
    item = grpc_attention(stub, pb.Input(text=TEXT), layers=[4])
    check_standalone(browser, file, list(item.tokens), layer=4, head=2, expected=as_array(item.attentions)[0, 2])
    screenshot(browser, "standalone")
    for name in ("rollout", "norms-summed"):
        tab(browser, name.removesuffix("-summed"))
        assert js(browser, "window.explorer.mapInfo(arguments[0]).rows", name) == len(item.tokens)
    tab(browser, "modelview")
    assert js(browser, THUMBS) == 6 * 12
    assert js(browser, "window.explorer.state().requests") == 0
    assert page_errors(browser) == []


def tiny_reply(tokens: list[str]) -> dict:
    """A hand-made reply of one layer and one head, its weights as nested lists."""
    T = len(tokens)
    return {"object": "list", "model": "m", "data": [{
        "index": 0, "tokens": tokens, "num_tokens": T, "truncated": False, "layers": [0], "heads": [0],
        "shape": [1, 1, T, T], "attentions": np.full((1, 1, T, T), 1 / T, dtype=np.float32).tolist()}]}


def test_the_standalone_html_keeps_a_word_piece_that_would_close_its_script(browser, tmp_path):
    tokens = ["[CLS]", "</script><script>window.pwned = 1</script>", "<!--", "[SEP]"]
    file = tmp_path / "hostile.html"
    file.write_text(standalone_html(tiny_reply(tokens)), encoding="utf-8")
    browser.get(file.as_uri())
    wait_for(browser, "window.explorer && window.explorer.heatmapInfo()")
    assert js(browser, "window.explorer.heatmapInfo().rowLabels") == tokens
    assert js(browser, "window.pwned") is None


@pytest.mark.parametrize("change, words", [
    (None, "shows one input; this reply has 2 items"),  # the item twice
    ({"attentions": None}, "weights false"),
    ({"heads": [0, 1]}, "averages its heads"),
])
def test_a_standalone_html_of_what_it_cannot_show_is_refused_in_words(change, words):
    reply = tiny_reply(["[CLS]", "a", "[SEP]"])
    item = reply["data"][0]
    data = [{**item, **change}] if change else [item, item]
    with pytest.raises(ValueError, match=words):
        standalone_html({**reply, "data": data})


# --- API keys and long inputs ------------------------------------------------------------------------------------

def test_a_missing_or_wrong_api_key_shows_the_servers_message(browser, keyed):
    open_page(browser, keyed.http_url)
    no_key = httpx.get(f"{keyed.http_url}/v1/models", timeout=30).json()["error"]["message"]
    assert element(browser, "error").text == no_key  # the models' list was refused
    wrong = httpx.post(f"{keyed.http_url}/v1/attention", json={"inputs": TEXT, "truncate": True},
                       headers={"Authorization": "Bearer wrong"}, timeout=30)
    assert wrong.status_code == 401
    element(browser, "api-key").send_keys("wrong")
    set_text(browser, "text", TEXT)
    element(browser, "show").click()
    wait_for(browser, "document.getElementById('error').textContent === arguments[0]", wrong.json()["error"]["message"])
    assert element(browser, "error").is_displayed()
    screenshot(browser, "wrong-key")
    assert js(browser, "window.explorer.state().errors") == []


# Counts the calls of a 2D canvas's drawing methods (each still draws): the work a drawing does, whatever the clock.
COUNT_CANVAS_CALLS = """
window.canvasCalls = {putImageData: 0, fillRect: 0, drawImage: 0};
for (const name of Object.keys(window.canvasCalls)) {
  const original = CanvasRenderingContext2D.prototype[name];
  CanvasRenderingContext2D.prototype[name] = function (...args) {
    window.canvasCalls[name] += 1;
    return original.apply(this, args);
  };
}
"""


def test_a_512_token_map_is_drawn_in_one_image_write_from_two_requests(browser, keyed):
    """The work a 512-token Show costs, not a clock's reading: its tokens and the last layer's maps in a request
    each, and the 512 x 512 cells written as one ImageData (a rectangle a cell would be 262,144 fillRect calls)."""
    open_with_key(browser, keyed.http_url, "tiny")
    set_text(browser, "text", " ".join(string.ascii_lowercase[i % 26] for i in range(600)))  # 602 pieces, cut at 512
    browser.execute_script(COUNT_CANVAS_CALLS)
    requests = js(browser, "window.explorer.state().requests")
    click_until_drawn(browser, "show")
    info = js(browser, "window.explorer.heatmapInfo()")
    assert info["rows"] == info["cols"] == 512 and info["cell"] >= 1 and info["drawCount"] == 1
    calls = js(browser, "window.canvasCalls")
    assert calls["putImageData"] == 1 and calls["drawImage"] == 1, calls
    assert calls["fillRect"] < 2 * 512, calls  # the page's white and the colour bar's rows
    assert js(browser, "window.explorer.state().requests") - requests == 2
    assert info["drawnMs"] > 0
    assert "(cut at max_seq_length)" in element(browser, "status").text
    change(browser, "scale", "log")  # a random model's weights near 1/512: the log scale shows them apart
    screenshot(browser, "512-tokens")
    # the key goes with every request: the model view's (a layer each) and the norms' too
    tab(browser, "modelview")
    assert js(browser, THUMBS) == 2 * 2
    tab(browser, "norms")
    assert js(browser, "window.explorer.mapInfo('norms-summed').rows") == 512
    assert not element(browser, "error").is_displayed(), element(browser, "error").text
    assert page_errors(browser) == []


def test_a_causal_models_masked_cells_are_drawn_hatched_and_said_masked_not_zero(browser, keyed):
    """CLIP's text tower is causal: the server says each layer's reach ([null, 0]), and the page draws the cells above
    the diagonal in a grey no scale uses, says "masked" for them, and the served weight for the others."""
    reply = httpx.post(f"{keyed.http_url}/v1/attention", timeout=60, headers={"Authorization": f"Bearer {API_KEY}"},
                       json={"model": "clip", "inputs": TEXT, "layers": [-1]}).json()["data"][0]
    assert reply["reach"] == [[None, 0]]
    with keyed.channel() as channel:  # gRPC says the same, per layer asked; a bidirectional model bounds nothing
        causal = grpc_attention(keyed.stub(channel), pb.Input(text=TEXT), [-1, 0], model="clip")
        every = grpc_attention(keyed.stub(channel), pb.Input(text=TEXT), [0], model="minilm")
    assert [(r.HasField("behind"), r.HasField("ahead"), r.ahead) for r in causal.reach] == [(False, True, 0)] * 2
    assert [(r.HasField("behind"), r.HasField("ahead")) for r in every.reach] == [(False, False)]
    weights = np.asarray(reply["attentions"], dtype=np.float32)[0]  # (heads, T, T)
    T = len(reply["tokens"])
    open_with_key(browser, keyed.http_url, "clip")
    show(browser, TEXT)
    info = js(browser, "window.explorer.heatmapInfo()")
    assert info["reach"] == [None, 0] and info["closedCount"] == T * (T - 1) // 2
    assert "masked (causal: no query sees a later key)" in element(browser, "heatmap-caption").text
    for row, col in ((0, 1), (2, T - 1), (T - 2, T - 1)):  # above the diagonal
        point_at_element(browser, "heatmap", "window.explorer.cellCenter(arguments[0], arguments[1])", row, col)
        box = element(browser, "hover")
        assert box.get_attribute("data-masked") == "true" and "masked (causal" in box.text, box.text
        pixel = js(browser, """(() => { const c = document.querySelector('#heatmap canvas');
            const p = window.explorer.cellCenter(arguments[0], arguments[1]), r = c.getBoundingClientRect();
            return [...c.getContext('2d').getImageData(p.x - r.left, p.y - r.top, 1, 1).data]; })()""", row, col)
        assert pixel[0] == pixel[1] == pixel[2] and pixel[0] in (200, 0x8C), pixel  # the grey or its stripe
    mean = weights.mean(axis=0)  # the heatmap shows the heads' mean until a head is chosen
    assert_hovers(browser, "heatmap", [(0, 0), (T - 1, 0), (T - 1, T - 1), (3, 2)], mean, abs=1e-6)
    assert 'fill="url(#closed)"' in js(browser, "window.explorer.svg()")
    screenshot(browser, "causal")
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


def test_the_image_tab_draws_the_class_tokens_map_and_rollout_over_the_picture(browser, keyed, picture):
    from attnserve.patch_attention import patch_maps, patch_rollout

    open_with_key(browser, keyed.http_url, "clip")
    element(browser, "image-file").send_keys(str(picture))
    element(browser, "show-image").click()
    wait_for(browser, "(window.explorer.imageInfo('map') && window.explorer.imageInfo('rollout')) || "
                      "!document.getElementById('error').hidden")
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
    assert np.allclose(js(browser, "window.explorer.imageInfo('map')")["grid"], patch_maps(maps, True)[0, 2].ravel(),
                       atol=1e-6)
    point_at_element(browser, "image-map", "window.explorer.imagePatchCenter('map', 1, 2)")
    assert element(browser, "hover-image-map").text.startswith("patch 1,2: ")
    screenshot(browser, "image", at="tabs")
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
    result = browser.execute_async_script(NAFLEX_DRAW)
    info = result["info"]
    assert (info["rows"], info["cols"], info["g"], info["fit"]) == (3, 5, None, "patches")
    assert (result["width"], result["height"]) == (info["width"], info["height"]) == (360, 216)  # 72 px a patch
    centres = result["centres"]  # each patch's centre, row-major: only patch 9 (row 1, column 4) is bright
    assert int(np.argmax(centres)) == 9 and len(set(centres[:9] + centres[10:])) == 1
    for row, col, value in ((1, 4, 1.0), (2, 0, 0.0)):
        point_at_element(browser, "naflex-test", "window.naflexView.patchCenter(arguments[0], arguments[1])", row,
                         col)
        label, shown = element(browser, "naflex-test-hover").text.split(": ")
        assert label == f"patch {row},{col}" and float(shown) == value
    assert page_errors(browser) == []


def test_an_image_for_a_text_model_is_refused_on_the_page(browser, server, picture):
    open_page(browser, server.http_url)
    element(browser, "image-file").send_keys(str(picture))
    element(browser, "show-image").click()
    wait_for(browser, "!document.getElementById('error').hidden")
    assert "is a text model" in element(browser, "error").text
    assert js(browser, "window.explorer.state().errors") == []
