// An image's attention over its patches (an image-text model's: CLIP, SigLIP), drawn over the picture: the part the
// model saw (its center square for CLIP's processor, "crop"; all of it stretched square for SigLIP's, "stretch"),
// each patch's box filled with its weight's colour, blended with the picture. The grids are read from the maps as
// engine/patch_attention.py reads them: with a class token (CLIP) its row over the patches, renormalised; without
// one (SigLIP) the attention each patch receives, averaged over the patches' rows.
"use strict";
(function (ns) {
  const { makeScale, formatValue } = ns.colors;
  const ALPHA = 0.6; // the colours' share of each pixel: the picture stays readable under them

  // (T, T) row-major weights -> the g x g grid (Float64Array, row-major) summing to 1.
  function patchGrid(rows, T, classToken) {
    const first = classToken ? 1 : 0, n = T - first;
    const grid = new Float64Array(n);
    if (classToken) {
      for (let j = 0; j < n; j++) grid[j] = rows[j + first];
    } else {
      for (let i = 0; i < T; i++) for (let j = 0; j < n; j++) grid[j] += rows[i * T + j] / T;
    }
    let sum = 0;
    for (const v of grid) sum += v;
    for (let j = 0; j < n; j++) grid[j] = sum > 0 ? grid[j] / sum : 0;
    return grid;
  }

  // The heads' (or one head's) grid of a layer's maps Float32Array [heads, T, T].
  function layerGrid(values, heads, T, head, classToken) {
    const grid = new Float64Array(T - (classToken ? 1 : 0));
    const chosen = head === "mean" ? [...Array(heads).keys()] : [Number(head)];
    for (const h of chosen) {
      const g = patchGrid(values.subarray(h * T * T, (h + 1) * T * T), T, classToken);
      for (let j = 0; j < g.length; j++) grid[j] += g[j] / chosen.length;
    }
    return grid;
  }

  class ImageView {
    constructor(canvas, hover, side = 360) {
      this.canvas = canvas;
      this.hover = hover;
      this.side = side;
      this.shown = null; // {grid, g, fit, scale}
      canvas.addEventListener("mousemove", (e) => this.onHover(e));
    }

    // picture: a decoded <img>; grid: g x g weights; fit: "crop" or "stretch"; scale: "fixed" (0..1) or "max".
    draw(picture, grid, g, fit, scaleKind) {
      const side = this.side, canvas = this.canvas, ctx = canvas.getContext("2d");
      canvas.width = canvas.height = side;
      const w = picture.naturalWidth, h = picture.naturalHeight, m = Math.min(w, h);
      if (fit === "stretch") ctx.drawImage(picture, 0, 0, w, h, 0, 0, side, side);
      else ctx.drawImage(picture, (w - m) / 2, (h - m) / 2, m, m, 0, 0, side, side);
      let hi = 0;
      for (const v of grid) hi = Math.max(hi, v);
      const scale = makeScale("fixed", scaleKind === "max" ? hi : 1);
      const cell = side / g;
      ctx.globalAlpha = ALPHA;
      for (let i = 0; i < g; i++) {
        for (let j = 0; j < g; j++) {
          ctx.fillStyle = scale.hex(grid[i * g + j]);
          ctx.fillRect(j * cell, i * cell, Math.ceil(cell), Math.ceil(cell));
        }
      }
      ctx.globalAlpha = 1;
      this.shown = { grid: Array.from(grid), g, fit, scale: scaleKind };
    }

    onHover(e) {
      if (!this.shown || !this.hover) return;
      const box = this.canvas.getBoundingClientRect(), g = this.shown.g;
      const col = Math.floor(((e.clientX - box.left) / box.width) * g);
      const row = Math.floor(((e.clientY - box.top) / box.height) * g);
      if (row < 0 || col < 0 || row >= g || col >= g) return;
      this.hover.textContent = `patch ${row},${col}: ${formatValue(this.shown.grid[row * g + col])}`;
    }

    // What is drawn, for tests: the grid, its side, the fit, and the canvas's pixel at a patch's centre.
    info() {
      return this.shown;
    }

    patchCenter(row, col) {
      const box = this.canvas.getBoundingClientRect(), g = this.shown.g;
      return { x: box.left + ((col + 0.5) / g) * box.width, y: box.top + ((row + 0.5) / g) * box.height };
    }
  }

  ns.ImageView = ImageView;
  ns.patchGrids = { patchGrid, layerGrid };
})(window.attnserveExplorer = window.attnserveExplorer || {});
