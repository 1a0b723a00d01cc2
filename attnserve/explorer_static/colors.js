// Colour scales: how a value becomes a colour, and what the colour bar says about it.
//
// A scale maps a value to t in [0, 1], t to one of 256 colours. Sequential maps use viridis (perceptually
// uniform, readable in grey and by most colour-blind readers); a difference map uses a blue-white-red diverging
// map centred on 0. The kinds a reader picks:
//   fixed: t = v / hi, hi 1 for weights (and rollout), whose rows sum to 1; for norms hi is the map's maximum.
//   row:   t = v / (the row's maximum): each query's own strongest key is the top colour.
//   log:   t = log10(v / hi) / DECADES + 1, clamped: 4 decades below hi, where most of a map's weights live.
"use strict";
(function (ns) {
  const DECADES = 4;
  // matplotlib's viridis at 0, 1/8, ..., 1; the 256 colours between are interpolated linearly.
  const VIRIDIS = [[68, 1, 84], [72, 40, 120], [62, 73, 137], [49, 104, 142], [38, 130, 142], [31, 158, 137],
    [53, 183, 121], [110, 206, 88], [253, 231, 37]];
  // ColorBrewer's RdBu, reversed: negative blue, zero near white, positive red.
  const DIVERGING = [[33, 102, 172], [103, 169, 207], [247, 247, 247], [239, 138, 98], [178, 24, 43]];

  function lut(anchors) {
    const table = new Uint8Array(256 * 3);
    for (let i = 0; i < 256; i++) {
      const x = (i / 255) * (anchors.length - 1);
      const k = Math.min(Math.floor(x), anchors.length - 2), f = x - k;
      for (let c = 0; c < 3; c++) table[i * 3 + c] = Math.round(anchors[k][c] * (1 - f) + anchors[k + 1][c] * f);
    }
    return table;
  }

  const TABLES = { sequential: lut(VIRIDIS), diverging: lut(DIVERGING) };

  function rowMaxima(values, rows, cols) {
    const max = new Float64Array(rows);
    for (let i = 0; i < rows; i++) {
      let m = 0;
      for (let j = 0; j < cols; j++) m = Math.max(m, values[i * cols + j]);
      max[i] = m;
    }
    return max;
  }

  function maximum(values) {
    let m = 0;
    for (let i = 0; i < values.length; i++) m = Math.max(m, Math.abs(values[i]));
    return m;
  }

  // kind: "fixed", "row", "log" or "diverging"; hi: the top of the scale (fixed, log; diverging: +-hi);
  // rowMax: the rows' maxima for "row" (Float64Array), shared when two maps are compared on one scale.
  function makeScale(kind, hi, rowMax) {
    const top = hi > 0 ? hi : 1;
    const table = kind === "diverging" ? TABLES.diverging : TABLES.sequential;
    let position;
    if (kind === "row") position = (v, row) => (rowMax[row] > 0 ? v / rowMax[row] : 0);
    else if (kind === "log") position = (v) => (v > 0 ? Math.log10(v / top) / DECADES + 1 : 0);
    else if (kind === "diverging") position = (v) => 0.5 + v / (2 * top);
    else position = (v) => v / top;
    const index = (v, row) => {
      const t = position(v, row);
      return t >= 1 ? 255 : t > 0 ? Math.floor(t * 256) : 0; // NaN and below 0: the bottom colour
    };
    return {
      kind, hi: top, table, index,
      rgb(v, row) {
        const i = index(v, row) * 3;
        return [table[i], table[i + 1], table[i + 2]];
      },
      hex(v, row) {
        return "#" + this.rgb(v, row).map((c) => c.toString(16).padStart(2, "0")).join("");
      },
      // The colour bar's labelled ticks: [fraction of the bar from the bottom, label].
      ticks() {
        if (kind === "row") return [[0, "0"], [0.5, "0.5 × row max"], [1, "row max"]];
        if (kind === "log") {
          return [...Array(DECADES + 1).keys()].map((d) => [d / DECADES, formatShort(top * 10 ** (d - DECADES))]);
        }
        if (kind === "diverging") return [[0, formatShort(-top)], [0.5, "0"], [1, formatShort(top)]];
        return [0, 0.25, 0.5, 0.75, 1].map((f) => [f, formatShort(f * top)]);
      },
      // The colour at a fraction of the bar, from the bottom.
      barRgb(f) {
        const i = Math.min(255, Math.floor(f * 256)) * 3;
        return [table[i], table[i + 1], table[i + 2]];
      },
    };
  }

  // A tick's label: short, exact enough to read a bar by.
  function formatShort(v) {
    if (v === 0) return "0";
    const a = Math.abs(v);
    if (a >= 0.01 && a < 1000) return String(Number(v.toPrecision(3)));
    return v.toExponential(0).replace("e+", "e");
  }

  // A hovered value: 9 significant digits, enough to give back the float32 the server sent exactly.
  function formatValue(v) {
    return Number(v).toPrecision(9);
  }

  // One colour per head, told apart in the head view: Tableau's ten, then the same hues darker.
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf"];
  function headColor(head) {
    const base = PALETTE[head % PALETTE.length];
    if (head < PALETTE.length) return base;
    const [r, g, b] = [1, 3, 5].map((i) => Math.round(parseInt(base.slice(i, i + 2), 16) * 0.6));
    return `rgb(${r}, ${g}, ${b})`;
  }

  ns.colors = { makeScale, rowMaxima, maximum, formatValue, formatShort, headColor, DECADES };
})(window.attnserveExplorer = window.attnserveExplorer || {});
