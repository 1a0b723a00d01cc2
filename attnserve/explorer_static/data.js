// Where the explorer's numbers come from: the server's POST /v1/attention (ServerSource), or a reply embedded in
// a standalone page (StandaloneSource). Both answer the same three questions: the overview of an input (word
// pieces, layer and head counts, rollout, head statistics), one layer's weights of every head, and one layer's
// norms. Weights travel as base64 (little-endian float32, row-major), a quarter of nested lists' size and parsed
// without a JSON number in sight.
"use strict";
(function (ns) {
  // An error to show as it is: the server's own message, or what kept the request from reaching it.
  class ApiError extends Error {}

  // Every request the page made: a standalone page must make none (the tests read it).
  const counts = { requests: 0 };

  // base64 of little-endian float32 bytes -> Float32Array (every platform a browser runs on is little-endian).
  function fromBase64(text) {
    const binary = atob(text);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    return new Float32Array(bytes.buffer);
  }

  // Float32Array -> base64, in chunks: String.fromCharCode takes a bounded number of arguments.
  function toBase64(floats) {
    const bytes = new Uint8Array(floats.buffer, floats.byteOffset, floats.byteLength);
    let binary = "";
    for (let i = 0; i < bytes.length; i += 0x8000) {
      binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    }
    return btoa(binary);
  }

  // A reply's array as float32, whichever encoding_format it came in: a base64 string or nested lists.
  function floats(value) {
    if (typeof value === "string") return fromBase64(value);
    return Float32Array.from(value.flat(Infinity));
  }

  // The text of an error reply: OpenAI's envelope {"error": {"message"}}, TEI's and KServe's {"error": "..."}.
  function errorMessage(status, statusText, text) {
    try {
      const error = JSON.parse(text).error;
      if (typeof error === "string") return error;
      if (error && typeof error.message === "string") return error.message;
    } catch (e) {
      // not JSON: a proxy's page, say; its status is all there is to show
    }
    return `HTTP ${status} ${statusText}`.trim();
  }

  // The most seconds a request waits, in all, while the server builds a graph it needs (a model's first
  // attention request builds its attention graphs: seconds to minutes, once).
  const BUILD_WAIT_SECONDS = 600;

  // A 503 whose reason is a graph being built (OpenAI's envelope code "graph_building"): the seconds its
  // Retry-After names, else null.
  function buildingDelay(response, text) {
    if (response.status !== 503) return null;
    try {
      if (JSON.parse(text).error.code !== "graph_building") return null;
    } catch (e) {
      return null;
    }
    const ms = Number(response.headers.get("retry-after-ms"));
    return ms > 0 ? ms / 1000 : Math.max(1, Number(response.headers.get("Retry-After")) || 1);
  }

  // The server's JSON routes, with the API key the page was given on every request. waiting(message, seconds) is
  // told when a request waits for the server to build a graph (the page says so), and asks again after.
  class Api {
    constructor(key, waiting = () => {}) {
      this.key = key;
      this.waiting = waiting;
    }

    async request(path, body) {
      const headers = {};
      if (this.key) headers.Authorization = `Bearer ${this.key}`;
      if (body !== undefined) headers["Content-Type"] = "application/json";
      const until = performance.now() + BUILD_WAIT_SECONDS * 1000;
      for (;;) {
        counts.requests += 1;
        let response;
        try {
          // Relative: the page works behind a proxy that serves the server under a path prefix.
          response = await fetch(path, {
            method: body === undefined ? "GET" : "POST", headers,
            body: body === undefined ? undefined : JSON.stringify(body),
          });
        } catch (e) {
          throw new ApiError(`cannot reach the server: ${e.message}`);
        }
        const text = await response.text();
        if (response.ok) return JSON.parse(text);
        const delay = buildingDelay(response, text);
        const message = errorMessage(response.status, response.statusText, text);
        if (delay === null || performance.now() + delay * 1000 > until) throw new ApiError(message);
        this.waiting(message, delay);
        await new Promise((resolve) => setTimeout(resolve, delay * 1000));
      }
    }

    // [{id, attention, imageTower}] of the served models, the default first (GET /v1/models lists each model's
    // outputs, and an image-text model's image tower: its layers and heads).
    async models() {
      const reply = await this.request("v1/models");
      return reply.data.map((m) => ({ id: m.id, attention: !m.outputs || m.outputs.includes("attention"),
        imageTower: m.image_tower || null }));
    }

    attention(body) {
      return this.request("v1/attention", { encoding_format: "base64", truncate: true, ...body });
    }
  }

  // What every view needs to know of an input before any weight arrives.
  function overviewOf(entry, numLayers, model) {
    const numTokens = entry.tokens.length;
    const stats = {};
    for (const [name, grid] of Object.entries(entry.head_stats || {})) stats[name] = floats(grid);
    return {
      model, tokens: entry.tokens, numTokens, numLayers, heads: entry.heads, truncated: entry.truncated,
      pairStart: entry.pair_start ?? null, rollout: entry.rollout ? floats(entry.rollout) : null, headStats: stats,
      rolloutReach: rolloutReach(entry.reach, entry.layers, numLayers),
    };
  }

  // An entry's reach of its i-th layer, [behind, ahead] (null bounds: none), or null where the reply has none
  // (artifacts exported before the server said it).
  function reachAt(entry, i) {
    return Array.isArray(entry.reach) && Array.isArray(entry.reach[i]) ? entry.reach[i] : null;
  }

  // Rollout's reach: a product of every layer's 0.5 A + 0.5 I reaches as far as the layers' reaches added up.
  // null where any layer's is unknown or the entry does not cover every layer.
  function rolloutReach(reach, layers, numLayers) {
    if (!Array.isArray(reach) || reach.length !== numLayers || layers.length !== numLayers) return null;
    const add = (k) => (reach.some((r) => r[k] === null) ? null : reach.reduce((sum, r) => sum + r[k], 0));
    return [add(0), add(1)];
  }

  // One input's maps from the server, each layer fetched when a view first needs it and kept. A layer is one
  // request of its own: every layer at once would pass the server's max_response_bytes for long inputs.
  class ServerSource {
    constructor(api, input, model) {
      this.api = api;
      this.input = input;
      this.model = model;
      this.base = { inputs: [input], ...(model ? { model } : {}) };
      this.layers = new Map(); // layer index -> Promise of Float32Array [heads, T, T]
      this.norms = new Map(); // layer index -> Promise of {perHead: [heads, T, T], summed: [T, T]}
      this.tokens = null; // the word pieces, once a reply brought them
      this.standalone = false;
    }

    // Tokens, rollout and head statistics: every layer's every head analysed in the server, no weights sent.
    // The number of layers is that of the statistics' rows ([layers, heads], every head).
    async overview() {
      const reply = await this.api.attention({ ...this.base, analyses: ["rollout", "head_stats"], weights: false });
      const entry = reply.data[0];
      const anyStat = Object.values(entry.head_stats)[0];
      const numLayers = floats(anyStat).length / entry.heads.length;
      return overviewOf(entry, numLayers, reply.model);
    }

    // Resolves to {layer, values, reach}; index may count from the end (-1: the last), the reply says which it is.
    async layer(index) {
      if (index < 0) {
        const reply = await this.api.attention({ ...this.base, layers: [index] });
        const entry = reply.data[0], layer = entry.layers[0];
        this.tokens = entry.tokens;
        if (!this.layers.has(layer)) {
          this.layers.set(layer, Promise.resolve({ values: floats(entry.attentions), reach: reachAt(entry, 0) }));
        }
        return { layer, ...(await this.layers.get(layer)) };
      }
      if (!this.layers.has(index)) {
        // the promise is kept, so that views asking for the same layer at once share one request
        const pending = this.api.attention({ ...this.base, layers: [index] }).then((reply) => {
          const entry = reply.data[0];
          this.tokens = entry.tokens;
          return { values: floats(entry.attentions), reach: reachAt(entry, 0) };
        });
        pending.catch(() => this.layers.delete(index)); // a failure is shown, and asked again next time
        this.layers.set(index, pending);
      }
      return { layer: index, ...(await this.layers.get(index)) };
    }

    layerNorms(layer) {
      if (!this.norms.has(layer)) {
        const pending = this.api.attention({ ...this.base, layers: [layer], analyses: ["norms"], weights: false })
          .then((reply) => ({ perHead: floats(reply.data[0].norms), summed: floats(reply.data[0].norms_summed),
            reach: reachAt(reply.data[0], 0) }));
        pending.catch(() => this.norms.delete(layer)); // a refusal is shown, and asked again next time
        this.norms.set(layer, pending);
      }
      return this.norms.get(layer);
    }
  }

  // A /v1/attention reply embedded in the page (window.ATTNSERVE_DATA), covering every layer: no server at all.
  class StandaloneSource {
    constructor(reply) {
      if (!reply || !Array.isArray(reply.data) || reply.data.length === 0) {
        throw new ApiError("the embedded data is no /v1/attention reply: it has no `data`");
      }
      const entry = reply.data[0];
      if (!entry.attentions || !entry.shape) {
        throw new ApiError("the embedded reply has no attention weights (it was asked with weights false)");
      }
      const [numLayers, numHeads, rows, cols] = entry.shape;
      if (numHeads !== entry.heads.length) {
        throw new ApiError("the embedded reply averages its heads: the explorer needs every head's map");
      }
      this.entry = entry;
      this.model = reply.model;
      this.size = rows * cols;
      this.headCount = numHeads;
      this.all = floats(entry.attentions);
      this.standalone = true;
      // The file's layers by their index: entry.layers says which each block of `attentions` is.
      this.layerIndex = new Map(entry.layers.map((layer, i) => [layer, i]));
      this.numLayers = numLayers;
      this.normsAll = entry.norms ? floats(entry.norms) : null;
      this.normsSummedAll = entry.norms_summed ? floats(entry.norms_summed) : null;
    }

    async overview() {
      const overview = overviewOf(this.entry, Math.max(...this.entry.layers) + 1, this.model);
      overview.layerChoices = [...this.entry.layers].sort((a, b) => a - b);
      return overview;
    }

    async layer(index) {
      const layer = index < 0 ? Math.max(...this.entry.layers) + 1 + index : index;
      const i = this.layerIndex.get(layer);
      if (i === undefined) throw new ApiError(`layer ${layer} is not in this file (it holds ${this.entry.layers})`);
      const block = this.headCount * this.size;
      return { layer, values: this.all.subarray(i * block, (i + 1) * block), reach: reachAt(this.entry, i) };
    }

    async layerNorms(layer) {
      const i = this.layerIndex.get(layer);
      if (!this.normsAll || i === undefined) throw new ApiError("this file holds no norms for this layer");
      const block = this.headCount * this.size;
      return {
        perHead: this.normsAll.subarray(i * block, (i + 1) * block),
        summed: this.normsSummedAll.subarray(i * this.size, (i + 1) * this.size),
        reach: reachAt(this.entry, i),
      };
    }
  }

  // A reply of every layer, as a standalone page embeds it: the layers fetched one request at a time and joined.
  // onLayer(i, numLayers) reports progress. Norms are left out where the model refuses them (older artifacts).
  async function wholeReply(source, overview, onLayer) {
    const L = overview.numLayers, T = overview.numTokens;
    const heads = overview.heads.length;
    const weights = new Float32Array(L * heads * T * T);
    let norms = new Float32Array(L * heads * T * T), summed = new Float32Array(L * T * T);
    const reach = [];
    for (let layer = 0; layer < L; layer++) {
      onLayer(layer, L);
      const shown = await source.layer(layer);
      weights.set(shown.values, layer * heads * T * T);
      reach.push(shown.reach);
      if (norms) {
        try {
          const n = await source.layerNorms(layer);
          norms.set(n.perHead, layer * heads * T * T);
          summed.set(n.summed, layer * T * T);
        } catch (e) {
          norms = summed = null;
        }
      }
    }
    const entry = {
      index: 0, tokens: overview.tokens, num_tokens: T, truncated: overview.truncated,
      ...(overview.pairStart !== null ? { pair_start: overview.pairStart } : {}),
      layers: [...Array(L).keys()], heads: overview.heads, ...(reach.every((r) => r) ? { reach } : {}),
      shape: [L, heads, T, T], attentions: toBase64(weights),
      rollout: toBase64(overview.rollout),
      head_stats: Object.fromEntries(Object.entries(overview.headStats).map(([k, v]) => [k, toBase64(v)])),
      ...(norms ? { norms: toBase64(norms), norms_summed: toBase64(summed) } : {}),
    };
    return { object: "list", model: overview.model, data: [entry] };
  }

  ns.data = { ApiError, Api, ServerSource, StandaloneSource, wholeReply, floats, toBase64, counts };
})(window.attnserveExplorer = window.attnserveExplorer || {});
