// An image's attention over its patches (an image-text model's: CLIP, SigLIP), drawn over the picture: the part the
// model saw (its center square for CLIP's processor, "crop"; all of it stretched square for SigLIP's, "stretch"; all
// of it stretched to its rows x cols patches for SigLIP 2's NaFlex, "patches", whose grid need not be square), each
// patch's box filled with its weight's colour, blended with the picture. The grids are read from the maps as
// attnserve/patch_attention.py reads them: with a class token (CLIP) its row over the patches, renormalised; without
// one (SigLIP) the attention each patch receives, averaged over the patches' rows.
"use strict";
(function (ns) {
  const { makeScale, formatValue } = ns.colors;
  const ALPHA = 0.6; // the colours' share of each pixel: the picture stays readable under them

  // (T, T) row-major weights -> the rows x cols grid (Float64Array, row-major) summing to 1.
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
      this.shown = null; // {grid, rows, cols, g, fit, scale, width, height}
      canvas.addEventListener("mousemove", (e) => this.onHover(e));
    }

    // picture: a decoded <img>; grid: rows x cols weights, row-major; fit: "crop", "stretch" or "patches"; scale:
    // "fixed" (0..1) or "max". The canvas is the image the model took: square, or rows x cols patches' aspect
    // ratio (its longer side `side` px).
    draw(picture, grid, rows, cols, fit, scaleKind) {
      const canvas = this.canvas, ctx = canvas.getContext("2d");
      const { width, height } = this.canvasSize(rows, cols);
      canvas.width = width;
      canvas.height = height;
      const w = picture.naturalWidth, h = picture.naturalHeight, m = Math.min(w, h);
      // stretch and patches: the whole picture, resized as the processor resized it; crop: its centre square
      if (fit === "crop") ctx.drawImage(picture, (w - m) / 2, (h - m) / 2, m, m, 0, 0, width, height);
      else ctx.drawImage(picture, 0, 0, w, h, 0, 0, width, height);
      let hi = 0;
      for (const v of grid) hi = Math.max(hi, v);
      const scale = makeScale("fixed", scaleKind === "max" ? hi : 1);
      const cellW = width / cols, cellH = height / rows;
      ctx.globalAlpha = ALPHA;
      for (let i = 0; i < rows; i++) {
        for (let j = 0; j < cols; j++) {
          ctx.fillStyle = scale.hex(grid[i * cols + j]);
          ctx.fillRect(j * cellW, i * cellH, Math.ceil(cellW), Math.ceil(cellH));
        }
      }
      ctx.globalAlpha = 1;
      // g: a square grid's side (null otherwise), as the reply's image.grid
      this.shown = { grid: Array.from(grid), rows, cols, g: rows === cols ? rows : null, fit, scale: scaleKind,
        width, height };
    }

    // The canvas's pixels: `side` along the grid's longer side, the other in proportion (patches are square).
    canvasSize(rows, cols) {
      const side = this.side;
      if (rows === cols) return { width: side, height: side };
      return rows > cols ? { width: Math.max(1, Math.round((side * cols) / rows)), height: side }
        : { width: side, height: Math.max(1, Math.round((side * rows) / cols)) };
    }

    onHover(e) {
      if (!this.shown || !this.hover) return;
      const box = this.canvas.getBoundingClientRect(), { rows, cols } = this.shown;
      const col = Math.floor(((e.clientX - box.left) / box.width) * cols);
      const row = Math.floor(((e.clientY - box.top) / box.height) * rows);
      if (row < 0 || col < 0 || row >= rows || col >= cols) return;
      this.hover.textContent = `patch ${row},${col}: ${formatValue(this.shown.grid[row * cols + col])}`;
    }

    // What is drawn, for tests: the grid, its rows and cols (and g, a square's side), the fit, the canvas's size.
    info() {
      return this.shown;
    }

    patchCenter(row, col) {
      const box = this.canvas.getBoundingClientRect(), { rows, cols } = this.shown;
      return { x: box.left + ((col + 0.5) / cols) * box.width, y: box.top + ((row + 0.5) / rows) * box.height };
    }
  }

  ns.ImageView = ImageView;
  ns.patchGrids = { patchGrid, layerGrid };
})(window.attnserveExplorer = window.attnserveExplorer || {});
