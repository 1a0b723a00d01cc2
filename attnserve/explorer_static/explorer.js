// The explorer page: its controls, its tabs, and which view draws what. The numbers come from data.js (the
// server, or a reply embedded in a standalone file as window.ATTNSERVE_DATA), the drawings from mapview.js,
// headview.js, modelview.js and stats.js. window.explorer is the page's API for tests and for the console.
"use strict";
(function (ns) {
  const { Api, ApiError, ServerSource, StandaloneSource, wholeReply, counts } = ns.data;
  const { rowMaxima, maximum } = ns.colors;
  const $ = (id) => document.getElementById(id);
  // Where a standalone file carries its data (explorer.py's standalone_html writes the same). Spelled in pieces:
  // inlined into the page, a literal comment opening or script end tag would change how HTML parses this script.
  const DATA_MARKER = "<" + "!-- attnserve:data -->";
  const SCRIPT_OPEN = "<" + "script>", SCRIPT_CLOSE = "<" + "/script>";

  const state = {
    api: new Api("", waiting),
    source: null, // where the shown input's maps come from
    overview: null, // its word pieces, layer and head counts, rollout and head statistics
    layer: -1, // the chosen layer (-1: the last, until the first reply says which that is)
    head: "mean", // "mean" or a head number
    tab: "heatmap",
    generation: 0, // bumped by each Show: replies to an older one are dropped
    modelViewRun: 0, // bumped by each model view drawing: a newer one stops an older one's fetches
    modelViewKey: null, // what the model view shows now
    shownAt: null, // performance.now() of the Show click, until the heatmap is drawn
    drawnMs: null, // Show click to heatmap drawn, of the last Show
    busy: 0, // operations in flight
    compare: null, // {source}: the right-hand input of the compare tab
    models: [], // the served models, as Api.models gives them
    // the shown image: {picture, maps: Float32Array [L, heads, T, T], rollout, T, L, heads, layout, rows, cols}
    image: null,
    errors: [], // the page's own failures (bugs), never the server's refusals
  };

  const beside = { mapPx: 400 }; // two maps side by side fit a laptop's screen
  const views = {
    heatmap: new ns.MapView($("heatmap"), $("hover")),
    rollout: new ns.MapView($("rollout"), $("hover-rollout")),
    "norms-head": new ns.MapView($("norms-head"), $("hover-norms-head"), beside),
    "norms-summed": new ns.MapView($("norms-summed"), $("hover-norms-summed"), beside),
    "compare-a": new ns.MapView($("compare-a"), $("hover-compare-a"), beside),
    "compare-b": new ns.MapView($("compare-b"), $("hover-compare-b"), beside),
    "compare-diff": new ns.MapView($("compare-diff"), $("hover-compare-diff"), beside),
  };
  const imageViews = { map: new ns.ImageView($("image-map"), $("hover-image-map")),
    rollout: new ns.ImageView($("image-rollout"), $("hover-image-rollout")) };
  const headView = new ns.HeadView($("headview"), $("head-toggles"));
  const modelView = new ns.ModelView($("modelview"), (layer, head) => open(layer, head));

  // --- messages

  function showError(error) {
    const box = $("error");
    if (error instanceof ApiError) {
      box.textContent = error.message; // the server's words, as it said them
    } else {
      state.errors.push(String(error && error.stack ? error.stack : error));
      box.textContent = `the page failed: ${error && error.message ? error.message : error}`;
    }
    box.hidden = false;
  }

  function clearError() {
    $("error").hidden = true;
    $("error").textContent = "";
  }

  // The server is building a graph a request needs (its attention graphs, once): say so while the request waits.
  function waiting(message, seconds) {
    setStatus(`${message} (asking again in ${Math.ceil(seconds)} s)`);
  }

  function setStatus(text) {
    $("status").textContent = text;
  }

  // Runs an async step of the page, its failure shown.
  async function track(step) {
    state.busy += 1;
    try {
      await step();
    } catch (error) {
      showError(error);
    } finally {
      state.busy -= 1;
    }
  }

  // --- models and input

  async function loadModels() {
    const models = state.models = await state.api.models();
    for (const select of [$("model"), $("compare-model")]) {
      const previous = select.value;
      select.replaceChildren(...models.map((m) => {
        const option = new Option(m.attention ? m.id : `${m.id} (no attention)`, m.id);
        option.disabled = !m.attention;
        return option;
      }));
      const usable = models.filter((m) => m.attention).map((m) => m.id);
      select.value = usable.includes(previous) ? previous : usable[0] || "";
    }
    setStatus(`${models.length} model${models.length === 1 ? "" : "s"} served; type a text and press Show.`);
  }

  function typedInput() {
    const a = $("text").value, b = $("text-b").value;
    if (!a.trim()) throw new ApiError("type a text first");
    return b.trim() ? [a, b] : a;
  }

  async function show() {
    state.shownAt = performance.now();
    clearError();
    const key = $("api-key").value.trim();
    if (key !== state.api.key) state.api = new Api(key, waiting);
    const source = new ServerSource(state.api, typedInput(), $("model").value);
    // another model may have fewer layers: start again from the last
    if (!state.source || state.source.model !== source.model) state.layer = -1;
    await load(source);
  }

  // The overview and the chosen layer, asked at once: the heatmap needs only the layer. The replies to a Show
  // that a newer one overtook are dropped, its failures too.
  async function load(source) {
    const generation = ++state.generation;
    setStatus("asking the server…");
    let overview, first;
    try {
      [overview, first] = await Promise.all([source.overview(), source.layer(state.layer)]);
    } catch (error) {
      if (generation !== state.generation) return;
      setStatus("");
      throw error;
    }
    if (generation !== state.generation) return;
    state.source = source;
    state.overview = overview;
    state.layer = first.layer;
    state.compare = null;
    fillSelects(overview);
    const { numTokens, numLayers, heads } = overview;
    setStatus(`${overview.model}: ${numTokens} word pieces${overview.truncated ? " (cut at max_seq_length)" : ""}, `
      + `${numLayers} layers × ${heads.length} heads.`);
    await renderActive();
  }

  function fillSelects(overview) {
    const layers = overview.layerChoices || [...Array(overview.numLayers).keys()];
    const last = overview.numLayers - 1;
    $("layer").replaceChildren(...layers.map((l) => new Option(l === last ? `${l} (last)` : String(l), String(l))));
    $("layer").value = String(state.layer);
    if (state.head !== "mean" && !overview.heads.includes(state.head)) state.head = "mean";
    $("head").replaceChildren(new Option("mean of heads", "mean"),
      ...overview.heads.map((h) => new Option(`head ${h}`, String(h))));
    $("head").value = String(state.head);
  }

  // --- what a view draws

  function headLabel(head) {
    return head === "mean" ? "mean of heads" : `head ${head}`;
  }

  // One map of a layer's [heads, T, T] block: a head's, or the heads' mean (in float64, as exact as the weights).
  function pick(values, heads, head, T) {
    if (head !== "mean") {
      const h = heads.indexOf(head);
      if (h < 0) throw new ApiError(`this model has no head ${head} (it has ${heads.length})`);
      return values.subarray(h * T * T, (h + 1) * T * T);
    }
    const mean = new Float64Array(T * T), count = values.length / (T * T);
    for (let h = 0; h < count; h++) {
      for (let k = 0; k < T * T; k++) mean[k] += values[h * T * T + k];
    }
    for (let k = 0; k < T * T; k++) mean[k] /= count;
    return mean;
  }

  function scale(values, T, hi = 1) {
    const kind = $("scale").value;
    return { kind, hi, rowMax: kind === "row" ? rowMaxima(values, T, T) : null };
  }

  async function renderActive() {
    if (state.tab === "image") return renderImage(); // an image's maps need no text shown
    if (!state.overview) return;
    const render = { heatmap: renderHeatmap, headview: renderHeadView, modelview: renderModelView,
      rollout: renderRollout, norms: renderNorms, stats: renderStats, compare: renderCompare,
      image: renderImage }[state.tab];
    await render();
  }

  async function renderHeatmap() {
    const { tokens, heads, pairStart } = state.overview;
    const { layer, values, reach } = await state.source.layer(state.layer);
    const map = pick(values, heads, state.head, tokens.length);
    views.heatmap.show({ values: map, rowLabels: tokens, colLabels: tokens, scale: scale(map, tokens.length),
      pairStart, reach });
    $("heatmap-caption").textContent = `Layer ${layer}, ${headLabel(state.head)}: row i is query i's attention over `
      + "the keys (columns), each row summing to 1"
      + (pairStart !== null ? `; segment b starts at token ${pairStart} (white lines)` : "")
      + (ns.describeReach(reach) ? `; hatched grey cells are masked (${ns.describeReach(reach)}).` : ".");
    if (state.shownAt !== null) {
      state.drawnMs = performance.now() - state.shownAt;
      state.shownAt = null;
    }
  }

  async function renderHeadView() {
    const { tokens, heads, pairStart } = state.overview;
    const { layer, values } = await state.source.layer(state.layer);
    headView.show({ tokens, values, heads, layer, pairStart });
  }

  // Each layer in a request of its own, in order, filling its row of thumbnails as it comes.
  async function renderModelView() {
    const { numLayers, heads, tokens } = state.overview;
    const key = [state.generation, $("scale").value].join();
    if (state.modelViewKey === key) return;
    state.modelViewKey = key;
    const run = ++state.modelViewRun;
    const layers = state.overview.layerChoices || [...Array(numLayers).keys()];
    modelView.reset(numLayers, heads);
    for (const [k, layer] of layers.entries()) {
      $("modelview-status").textContent = `layer ${k + 1} of ${layers.length}…`;
      let values;
      try {
        ({ values } = await state.source.layer(layer));
      } catch (error) {
        state.modelViewKey = null; // drawn again next time
        throw error;
      }
      if (run !== state.modelViewRun) return;
      modelView.fillLayer(layer, values, heads, tokens.length, $("scale").value);
    }
    $("modelview-status").textContent = `${layers.length} layers × ${heads.length} heads.`;
  }

  async function renderRollout() {
    const { tokens, rollout, pairStart, rolloutReach } = state.overview;
    if (!rollout) throw new ApiError("this reply holds no rollout");
    views.rollout.show({ values: rollout, rowLabels: tokens, colLabels: tokens, scale: scale(rollout, tokens.length),
      pairStart, reach: rolloutReach });
  }

  async function renderNorms() {
    const { tokens, heads, pairStart } = state.overview;
    const T = tokens.length, layer = state.layer;
    const norms = await state.source.layerNorms(layer);
    const one = state.head !== "mean";
    $("norms-head-figure").hidden = !one;
    if (one) {
      const map = pick(norms.perHead, heads, state.head, T);
      views["norms-head"].show({ values: map, rowLabels: tokens, colLabels: tokens,
        scale: scale(map, T, maximum(map)), pairStart, reach: norms.reach });
      $("norms-head-caption").textContent = `layer ${layer}, head ${state.head}: ‖a_ij f_h(x_j)‖`;
    }
    views["norms-summed"].show({ values: norms.summed, rowLabels: tokens, colLabels: tokens,
      scale: scale(norms.summed, T, maximum(norms.summed)), pairStart, reach: norms.reach });
    $("norms-summed-caption").textContent = `layer ${layer}, summed over heads`
      + (one ? "" : " (choose a head to see one head's norms beside it)");
  }

  async function renderStats() {
    const { headStats, numLayers, heads } = state.overview;
    ns.renderStats($("stats"), $("hover-stats"), headStats, numLayers, heads);
  }

  // --- compare

  async function compare() {
    if (!state.source) throw new ApiError("press Show first: the compare tab sets a second input beside that one");
    const text = $("compare-text").value;
    const input = text.trim() ? text : state.source.input;
    const model = $("compare-model").value;
    const previous = state.compare && state.compare.source;
    const reuse = previous && previous.model === model && JSON.stringify(previous.input) === JSON.stringify(input);
    state.compare = { source: reuse ? previous : new ServerSource(state.api, input, model) };
    await renderCompare();
  }

  function combinedLabels(a, b) {
    return a.map((t, i) => (t === b[i] ? t : `${t} / ${b[i]}`));
  }

  async function renderCompare() {
    if (!state.compare) {
      $("compare-note").textContent = "Type a second text, or choose another model, and press Compare.";
      return;
    }
    const { tokens, heads, numLayers } = state.overview;
    const left = state.source, right = state.compare.source;
    // Models of different depth are compared at the same relative depth: the last layer beside the last, the first
    // beside the first, and in between the nearest (layer l of L beside round(l (M-1) / (L-1)) of M).
    const lastB = (await right.layer(-1)).layer;
    const layerA = state.layer < 0 ? numLayers + state.layer : state.layer;
    const layerB = numLayers > 1 ? Math.round(layerA * lastB / (numLayers - 1)) : lastB;
    const [a, b] = await Promise.all([left.layer(state.layer), right.layer(layerB)]);
    const TA = tokens.length, tokensB = right.tokens, TB = tokensB.length;
    const headsB = [...Array(b.values.length / (TB * TB)).keys()];
    if (state.head !== "mean" && !headsB.includes(state.head)) {
      throw new ApiError(`${right.model || "the right-hand model"} has ${headsB.length} heads, no head ${state.head}: `
        + "choose a head both models have, or the mean of heads");
    }
    const mapA = pick(a.values, heads, state.head, TA), mapB = pick(b.values, headsB, state.head, TB);
    const kind = $("scale").value;
    // one scale for both: fixed and log are; row shares each row's maximum where the rows are the same tokens' rows
    let rowA = null, rowB = null;
    if (kind === "row") {
      rowA = rowMaxima(mapA, TA, TA);
      rowB = rowMaxima(mapB, TB, TB);
      if (TA === TB) rowA = rowB = rowA.map((m, i) => Math.max(m, rowB[i]));
    }
    views["compare-a"].show({ values: mapA, rowLabels: tokens, colLabels: tokens, scale: { kind, hi: 1, rowMax: rowA },
      pairStart: state.overview.pairStart, reach: a.reach });
    views["compare-b"].show({ values: mapB, rowLabels: tokensB, colLabels: tokensB,
      scale: { kind, hi: 1, rowMax: rowB }, reach: b.reach });
    const depth = (layer, last) => `layer ${layer} of 0..${last}${layer === last ? " (last)" : ""}`;
    const describe = (source, T, layer, last) => `${source.model || "default model"}: ${JSON.stringify(source.input)} `
      + `(${T} word pieces), ${depth(layer, last)}, ${headLabel(state.head)}`;
    $("compare-a-caption").textContent = describe(left, TA, a.layer, numLayers - 1);
    $("compare-b-caption").textContent = describe(right, TB, b.layer, lastB);
    // Said whenever the two sides are not the same layer: what is compared with what.
    const depthNote = lastB === numLayers - 1 ? ""
      : `The models differ in depth (${numLayers} and ${lastB + 1} layers): layer ${a.layer} is compared with `
        + `layer ${b.layer}, at the same relative depth. `;
    const figure = $("compare-diff-figure");
    if (TA !== TB) {
      figure.hidden = true;
      $("compare-note").textContent = `${depthNote}No difference map: the left input has ${TA} word pieces and the `
        + `right ${TB}; a difference needs the same number of rows and columns.`;
      return;
    }
    const diff = new Float64Array(TA * TA);
    for (let k = 0; k < diff.length; k++) diff[k] = mapA[k] - mapB[k];
    const labels = combinedLabels(tokens, tokensB);
    figure.hidden = false;
    views["compare-diff"].show({ values: diff, rowLabels: labels, colLabels: labels,
      scale: { kind: "diverging", hi: maximum(diff) } });
    $("compare-note").textContent = depthNote + (labels.some((l, i) => l !== tokens[i])
      ? "Both have as many word pieces but not the same ones: a label reads left / right." : "");
  }

  // --- tabs and choices

  // --- an image's attention over its patches (imageview.js)

  function readFile(file) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(new ApiError(`cannot read ${file.name}`));
      reader.readAsDataURL(file);
    });
  }

  async function showImage() {
    clearError();
    const file = $("image-file").files[0];
    if (!file) throw new ApiError("choose an image file first");
    const key = $("api-key").value.trim();
    if (key !== state.api.key) state.api = new Api(key, waiting);
    const model = $("model").value;
    const entry = state.models.find((m) => m.id === model);
    if (!entry || !entry.imageTower) {
      throw new ApiError(`${model || "the default model"} is a text model: images need an image-text model`);
    }
    const url = await readFile(file);
    const picture = new Image();
    picture.src = url;
    await picture.decode().catch(() => { throw new ApiError(`the browser cannot show ${file.name}`); });
    const L = entry.imageTower.num_layers;
    setStatus(`asking for ${file.name}'s attention over its patches...`);
    const reply = await state.api.attention({ inputs: [{ image: url }], model, layers: [...Array(L).keys()],
      analyses: ["rollout"] });
    const item = reply.data[0], T = item.num_tokens;
    state.image = { picture, maps: ns.data.floats(item.attentions), rollout: ns.data.floats(item.rollout), T, L,
      heads: item.shape[1], layout: item.image, rows: item.image.rows, cols: item.image.cols, name: file.name };
    const layerSelect = $("image-layer"), headSelect = $("image-head");
    layerSelect.replaceChildren(...[...Array(L).keys()].map((l) => new Option(`${l}`, String(l))));
    layerSelect.value = String(L - 1);
    headSelect.replaceChildren(new Option("mean of heads", "mean"),
      ...[...Array(state.image.heads).keys()].map((h) => new Option(`${h}`, String(h))));
    setStatus(`${file.name}: ${state.image.rows} x ${state.image.cols} patches of ${item.image.patch_size} px, ` +
      `${L} layers, ${state.image.heads} heads`);
    await switchTab("image");
  }

  async function renderImage() {
    const image = state.image;
    if (!image) return;
    const layer = Number($("image-layer").value), head = $("image-head").value;
    const { T, heads, layout, rows, cols } = image, block = heads * T * T;
    const grid = ns.patchGrids.layerGrid(image.maps.subarray(layer * block, (layer + 1) * block), heads, T, head,
      layout.class_token);
    imageViews.map.draw(image.picture, grid, rows, cols, layout.fit, "max");
    $("image-map-caption").textContent = `layer ${layer}, ${head === "mean" ? "mean of heads" : `head ${head}`}: ` +
      (layout.class_token ? "class token → patches" : "attention each patch receives");
    imageViews.rollout.draw(image.picture, ns.patchGrids.patchGrid(image.rollout, T, layout.class_token),
      rows, cols, layout.fit, "max");
  }

  function switchTab(tab) {
    state.tab = tab;
    for (const button of document.querySelectorAll("#tabs [data-tab]")) {
      const active = button.dataset.tab === tab;
      button.setAttribute("aria-selected", String(active));
      $(`panel-${button.dataset.tab}`).hidden = !active;
    }
    return track(renderActive);
  }

  function open(layer, head) {
    state.layer = layer;
    state.head = head;
    $("layer").value = String(layer);
    $("head").value = String(head);
    return switchTab("heatmap");
  }

  // --- downloads

  // The map of the open tab (the heatmap's where the tab has none of its own).
  function currentMap() {
    const tab = state.tab;
    if (tab === "rollout") return ["rollout", views.rollout];
    if (tab === "norms") return state.head === "mean" ? ["norms-summed", views["norms-summed"]]
      : ["norms", views["norms-head"]];
    if (tab === "compare" && views["compare-a"].map) return ["compare", views["compare-a"]];
    return ["attention", views.heatmap];
  }

  function fileName(kind, extension) {
    const head = state.head === "mean" ? "mean" : `head${state.head}`;
    return kind === "rollout" ? `rollout.${extension}` : `${kind}-layer${state.layer}-${head}.${extension}`;
  }

  function download(name, href) {
    const a = document.createElement("a");
    a.href = href;
    a.download = name;
    document.body.append(a);
    a.click();
    a.remove();
  }

  function blobUrl(text, type) {
    const url = URL.createObjectURL(new Blob([text], { type }));
    setTimeout(() => URL.revokeObjectURL(url), 60000);
    return url;
  }

  function requireMap() {
    const [kind, view] = currentMap();
    if (!view.map) throw new ApiError("nothing to download yet: press Show first");
    return [kind, view];
  }

  function png() {
    return requireMap()[1].toPNG();
  }

  function svg() {
    const [kind, view] = requireMap();
    return view.toSVG(`${kind}, layer ${state.layer}, ${headLabel(state.head)}`);
  }

  // The page itself with this input's every layer embedded: it opens from a file, with no server.
  async function standaloneHTML() {
    if (!state.source || state.source.standalone) throw new ApiError("press Show first");
    const reply = await wholeReply(state.source, state.overview,
      (layer, count) => setStatus(`gathering layer ${layer + 1} of ${count} for the file…`));
    counts.requests += 1;
    const page = await (await fetch("explorer")).text();
    setStatus("");
    return embed(page, reply);
  }

  // The page's marker replaced by the data; "<" escaped so that no text in it can close the script element.
  function embed(page, reply) {
    if (!page.includes(DATA_MARKER)) throw new ApiError("the page has no place for data (its marker is missing)");
    const json = JSON.stringify(reply).replace(/</g, "\\u003c");
    return page.replace(DATA_MARKER, () => `${SCRIPT_OPEN}window.ATTNSERVE_DATA = ${json};${SCRIPT_CLOSE}`);
  }

  // --- wiring

  function wire() {
    const run = (step) => () => track(async () => {
      clearError();
      await step();
    });
    $("show").addEventListener("click", () => track(show));
    $("text").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) track(show);
    });
    // The key lives in this page only (never stored): a new one lists the models again.
    $("api-key").addEventListener("change", run(async () => {
      state.api = new Api($("api-key").value.trim(), waiting);
      await loadModels();
    }));
    $("layer").addEventListener("change", () => {
      state.layer = Number($("layer").value);
      track(renderActive);
    });
    $("head").addEventListener("change", () => {
      state.head = $("head").value === "mean" ? "mean" : Number($("head").value);
      track(renderActive);
    });
    $("scale").addEventListener("change", () => track(renderActive));
    for (const button of document.querySelectorAll("#tabs [data-tab]")) {
      button.addEventListener("click", () => switchTab(button.dataset.tab));
    }
    $("compare-show").addEventListener("click", run(compare));
    $("show-image").addEventListener("click", () => track(showImage));
    $("image-layer").addEventListener("change", () => track(renderImage));
    $("image-head").addEventListener("change", () => track(renderImage));
    $("download-png").addEventListener("click", run(async () => download(fileName(currentMap()[0], "png"), png())));
    $("download-svg").addEventListener("click", run(async () => {
      download(fileName(currentMap()[0], "svg"), blobUrl(svg(), "image/svg+xml"));
    }));
    $("download-html").addEventListener("click", run(async () => {
      download("attention.html", blobUrl(await standaloneHTML(), "text/html"));
    }));
    window.addEventListener("error", (e) => state.errors.push(String(e.message)));
    window.addEventListener("unhandledrejection", (e) => state.errors.push(String(e.reason)));
  }

  async function start() {
    wire();
    switchTab("heatmap");
    if (window.ATTNSERVE_DATA) {
      // standalone: no server to ask, so no control that would
      document.body.classList.add("standalone");
      const source = new StandaloneSource(window.ATTNSERVE_DATA);
      $("source-note").textContent = `A standalone file of ${window.ATTNSERVE_DATA.model}: no server needed.`;
      await load(source);
    } else {
      await loadModels();
    }
  }

  window.explorer = {
    // the main heatmap: client coordinates of a cell's centre (MapView's layout), and what it shows
    cellCenter: (row, col) => views.heatmap.cellCenter(row, col),
    heatmapInfo: () => ({ ...views.heatmap.info(), layer: state.layer, head: state.head,
      scale: $("scale").value, drawnMs: state.drawnMs }),
    // any map by its name: heatmap, rollout, norms-head, norms-summed, compare-a, compare-b, compare-diff
    mapInfo: (name) => views[name].info(),
    mapCellCenter: (name, row, col) => views[name].cellCenter(row, col),
    headViewState: () => headView.state(),
    headViewTokenCenter: (side, index) => headView.tokenCenter(side, index),
    state: () => ({ mode: window.ATTNSERVE_DATA ? "standalone" : "server", requests: counts.requests,
      busy: state.busy, tab: state.tab, tokens: state.overview ? state.overview.tokens : null,
      numLayers: state.overview ? state.overview.numLayers : null,
      heads: state.overview ? state.overview.heads : null, errors: state.errors }),
    // the image tab: what each of its two pictures shows (grid, rows, cols, fit), and a patch's centre on the page
    imageInfo: (name) => imageViews[name].info(),
    imagePatchCenter: (name, row, col) => imageViews[name].patchCenter(row, col),
    open, switchTab, png, svg, standaloneHTML,
  };

  track(start);
})(window.attnserveExplorer = window.attnserveExplorer || {});
