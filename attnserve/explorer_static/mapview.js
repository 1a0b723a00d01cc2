// One map on a canvas: queries (rows) by keys (columns), each labelled with its word piece, a colour bar, and the
// exact value of the cell under the mouse; the same drawing as a PNG or an SVG.
//
// Layout, in CSS pixels of the canvas (which CSS never scales: its box scrolls instead):
//   cell = clamp(floor(mapPx / max(rows, cols)), 1, MAX_CELL), mapPx the view's size (MAP_PX unless it says)
//   left = labelWidth + GAP, top = left + TOP_PAD, labelWidth the widest label drawn (at most MAX_LABEL_PX)
//   cell (row, col) covers x in [left + col * cell, left + (col + 1) * cell), y in [top + row * cell, ...)
// cellAt(clientX, clientY) and cellCenter(row, col) are that mapping and its inverse, from the canvas's client
// rectangle: a pointer at cellCenter(r, c) is over cell (r, c), whatever the page's scroll.
// When cells are smaller than a label's line, every k-th label is drawn (k = ceil(LABEL_PX / cell)).
"use strict";
(function (ns) {
  const { makeScale, formatValue } = ns.colors;
  const { sizedCanvas } = ns.canvas;
  const MAP_PX = 640, MAX_CELL = 32, GAP = 6, MAX_LABEL_PX = 120, MAX_LABEL_CHARS = 18, LABEL_PX = 12;
  // TOP_PAD: room above the longest column label, whose glyphs an SVG viewer may draw a little wider
  const FONT = "11px sans-serif", TOP_PAD = 4, BAR_GAP = 16, BAR_WIDTH = 14, BAR_MIN_HEIGHT = 160, TICKS_WIDTH = 92;
  // A closed (masked) cell: a grey no colour scale uses (viridis and RdBu have no neutral grey), striped where cells
  // are large enough for stripes to show.
  const CLOSED_GREY = 200, HATCH_COLOR = "#8c8c8c", HATCH_MIN_CELL = 4;

  function shortLabel(token) {
    return token.length > MAX_LABEL_CHARS ? token.slice(0, MAX_LABEL_CHARS - 1) + "…" : token;
  }

  // A layer's reach [behind, ahead] (null bounds: none) -> (row, col) => whether the model's masks close that cell
  // (the query at row may not attend to the key at col), or null where nothing is closed (no reach, or none bounded).
  function closedCells(reach) {
    if (!reach || (reach[0] === null && reach[1] === null)) return null;
    const [behind, ahead] = reach;
    return (i, j) => (ahead !== null && j - i > ahead) || (behind !== null && i - j > behind);
  }

  // What a reach means, in words: a caption's and the hover readout's.
  function describeReach(reach) {
    if (!closedCells(reach)) return "";
    const [behind, ahead] = reach;
    if (ahead === 0 && behind === null) return "causal: no query sees a later key";
    if (ahead === 0) return `causal within a window: a query sees itself and the ${behind} keys before it`;
    if (behind === ahead) return `a local window: a query sees the keys at most ${behind} positions away`;
    const bound = (n, side) => (n === null ? `every key ${side}` : `${n} keys ${side}`);
    return `a query sees ${bound(behind, "before it")} and ${bound(ahead, "after it")}`;
  }

  function xmlEscape(text) {
    return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }

  class MapView {
    // container: an empty element to draw in; readout: the element that says the hovered cell's value.
    // mapPx: the largest side of the cells' square (maps side by side are smaller).
    constructor(container, readout, { rowName = "query", colName = "key", mapPx = MAP_PX } = {}) {
      this.container = container;
      this.mapPx = mapPx;
      this.readout = readout;
      this.placeholder = readout ? readout.textContent : ""; // said again whenever another map is drawn
      this.names = { row: rowName, col: colName };
      this.canvas = document.createElement("canvas");
      this.overlay = document.createElement("canvas");
      this.overlay.className = "map-overlay";
      container.classList.add("map");
      container.replaceChildren(this.canvas, this.overlay);
      this.drawCount = 0;
      this.map = null;
      container.addEventListener("mousemove", (e) => this.hover(e.clientX, e.clientY));
      container.addEventListener("mouseleave", () => this.clearOverlay());
    }

    // values: rows * cols numbers, row-major; rowLabels, colLabels: the word pieces; scale: {kind, hi, rowMax}
    // (colors.makeScale); pairStart: where segment b begins, marked on both axes (null: no pair).
    // reach: the layer's [behind, ahead] (data.js), whose closed cells are drawn hatched grey, not in the scale's
    // colours: a masked key, not a weight that came out 0; null: none known.
    show({ values, rowLabels, colLabels, scale, pairStart = null, reach = null }) {
      const rows = rowLabels.length, cols = colLabels.length;
      if (values.length !== rows * cols) throw new Error(`a map of ${values.length} values for ${rows} x ${cols}`);
      const colors = makeScale(scale.kind, scale.hi, scale.rowMax);
      this.map = { values, rowLabels, colLabels, rows, cols, colors, pairStart, reach, closed: closedCells(reach),
        scale: { kind: scale.kind, hi: scale.hi } }; // what info() reports: two maps compared share one
      if (this.readout) { // the last hovered value was the previous map's
        this.readout.textContent = this.placeholder;
        for (const key of ["row", "col", "value"]) delete this.readout.dataset[key];
      }
      this.layout = this.computeLayout();
      this.draw();
      this.drawCount += 1;
      this.container.dataset.drawn = String(this.drawCount);
    }

    computeLayout() {
      const { rows, cols, rowLabels, colLabels } = this.map;
      const cell = Math.max(1, Math.min(MAX_CELL, Math.floor(this.mapPx / Math.max(rows, cols))));
      const stride = Math.ceil(LABEL_PX / cell);
      const ctx = this.canvas.getContext("2d");
      ctx.font = FONT;
      let widest = 0;
      for (const labels of [rowLabels, colLabels]) {
        for (let i = 0; i < labels.length; i += stride) {
          widest = Math.max(widest, ctx.measureText(shortLabel(labels[i])).width);
        }
      }
      const labelWidth = Math.ceil(Math.min(MAX_LABEL_PX, widest));
      const left = labelWidth + GAP, top = labelWidth + GAP + TOP_PAD;
      const barHeight = Math.max(rows * cell, BAR_MIN_HEIGHT);
      const barX = left + cols * cell + BAR_GAP;
      return {
        cell, stride, left, top, barX, barHeight,
        width: barX + BAR_WIDTH + TICKS_WIDTH, height: top + barHeight + GAP,
      };
    }

    draw() {
      const { width, height } = this.layout;
      const ctx = sizedCanvas([this.canvas, this.overlay], width, height);  // the overlay sized alike, left clear
      this.drawCells(ctx);
      this.drawLabels(ctx);
      this.drawBar(ctx);
      this.clearOverlay();
    }

    // The cells at one pixel each on a canvas of their own, then scaled up without smoothing: one ImageData
    // write for the whole map, fast for 512 x 512 tokens.
    drawCells(ctx) {
      const { values, rows, cols, colors, pairStart, closed } = this.map;
      const { cell, left, top } = this.layout;
      const pixels = document.createElement("canvas");
      pixels.width = cols;
      pixels.height = rows;
      const image = pixels.getContext("2d").createImageData(cols, rows);
      const data = image.data;
      const table = colors.table;
      for (let i = 0; i < rows; i++) {
        for (let j = 0; j < cols; j++) {
          const k = (i * cols + j) * 4;
          if (closed && closed(i, j)) {
            data[k] = data[k + 1] = data[k + 2] = CLOSED_GREY;
          } else {
            const c = colors.index(values[i * cols + j], i) * 3;
            data[k] = table[c];
            data[k + 1] = table[c + 1];
            data[k + 2] = table[c + 2];
          }
          data[k + 3] = 255;
        }
      }
      pixels.getContext("2d").putImageData(image, 0, 0);
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(pixels, left, top, cols * cell, rows * cell);
      if (closed && cell >= HATCH_MIN_CELL) this.hatch(ctx);
      if (pairStart !== null && pairStart > 0) {
        ctx.strokeStyle = "#ffffff";
        ctx.lineWidth = 1;
        ctx.beginPath();
        ctx.moveTo(left + pairStart * cell, top);
        ctx.lineTo(left + pairStart * cell, top + rows * cell);
        ctx.moveTo(left, top + pairStart * cell);
        ctx.lineTo(left + cols * cell, top + pairStart * cell);
        ctx.stroke();
      }
    }

    // Stripes over the closed cells, one run of them per row: a masked cell reads as such at any colour scale.
    hatch(ctx) {
      const { rows, cols, closed } = this.map;
      const { cell, left, top } = this.layout;
      const tile = document.createElement("canvas");
      tile.width = tile.height = 6;
      const t = tile.getContext("2d");
      t.strokeStyle = HATCH_COLOR;
      t.beginPath();
      t.moveTo(0, 6);
      t.lineTo(6, 0);
      t.stroke();
      ctx.save();
      ctx.fillStyle = ctx.createPattern(tile, "repeat");
      for (let i = 0; i < rows; i++) {
        for (let j = 0; j < cols;) {
          if (!closed(i, j)) { j++; continue; }
          let end = j;
          while (end < cols && closed(i, end)) end++;
          ctx.fillRect(left + j * cell, top + i * cell, (end - j) * cell, cell);
          j = end;
        }
      }
      ctx.restore();
    }

    drawLabels(ctx) {
      const { rowLabels, colLabels, rows, cols } = this.map;
      const { cell, stride, left, top } = this.layout;
      ctx.font = FONT;
      ctx.fillStyle = "#222222";
      ctx.textBaseline = "middle";
      ctx.textAlign = "right";
      for (let i = 0; i < rows; i += stride) ctx.fillText(shortLabel(rowLabels[i]), left - 4, top + (i + 0.5) * cell);
      ctx.save();
      ctx.translate(left, top - 4);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      for (let j = 0; j < cols; j += stride) ctx.fillText(shortLabel(colLabels[j]), 0, (j + 0.5) * cell);
      ctx.restore();
      ctx.textAlign = "left";
    }

    drawBar(ctx) {
      const { colors } = this.map;
      const { barX, top, barHeight } = this.layout;
      for (let y = 0; y < barHeight; y++) {
        const [r, g, b] = colors.barRgb(1 - (y + 0.5) / barHeight);
        ctx.fillStyle = `rgb(${r}, ${g}, ${b})`;
        ctx.fillRect(barX, top + y, BAR_WIDTH, 1);
      }
      ctx.strokeStyle = "#666666";
      ctx.strokeRect(barX + 0.5, top + 0.5, BAR_WIDTH - 1, barHeight - 1);
      ctx.fillStyle = "#222222";
      ctx.font = FONT;
      ctx.textBaseline = "middle";
      for (const [f, label] of colors.ticks()) {
        const y = top + (1 - f) * (barHeight - 1) + 0.5;
        ctx.fillRect(barX + BAR_WIDTH, y - 0.5, 4, 1);
        ctx.fillText(label, barX + BAR_WIDTH + 7, y);
      }
    }

    // {row, col} of the cell under a pointer at client coordinates, or null outside the map.
    cellAt(clientX, clientY) {
      if (!this.map) return null;
      const rect = this.canvas.getBoundingClientRect();
      const { cell, left, top } = this.layout;
      const col = Math.floor((clientX - rect.left - left) / cell);
      const row = Math.floor((clientY - rect.top - top) / cell);
      if (row < 0 || col < 0 || row >= this.map.rows || col >= this.map.cols) return null;
      return { row, col };
    }

    // The client coordinates of a cell's centre: where a pointer must be to hover it.
    cellCenter(row, col) {
      const rect = this.canvas.getBoundingClientRect();
      const { cell, left, top } = this.layout;
      return { x: rect.left + left + (col + 0.5) * cell, y: rect.top + top + (row + 0.5) * cell };
    }

    hover(clientX, clientY) {
      const at = this.cellAt(clientX, clientY);
      if (!at) {
        this.clearOverlay();
        return;
      }
      const { row, col } = at;
      const { values, cols, rowLabels, colLabels, closed, reach } = this.map;
      const masked = Boolean(closed && closed(row, col));
      const text = masked ? `masked (${describeReach(reach)})` : formatValue(values[row * cols + col]);
      if (this.readout) {
        this.readout.dataset.row = String(row);
        this.readout.dataset.col = String(col);
        this.readout.dataset.value = text;
        this.readout.dataset.masked = String(masked);
        this.readout.textContent =
          `${this.names.row} ${row} “${rowLabels[row]}” → ${this.names.col} ${col} “${colLabels[col]}”: ${text}`;
      }
      this.drawOverlay(row, col);
    }

    // The hovered cell outlined, its row and column shaded, on a canvas of its own: the map is not redrawn.
    drawOverlay(row, col) {
      const ctx = this.overlay.getContext("2d");
      const ratio = window.devicePixelRatio || 1;
      const { cell, left, top } = this.layout;
      const { rows, cols } = this.map;
      ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
      ctx.clearRect(0, 0, this.layout.width, this.layout.height);
      ctx.fillStyle = "rgba(255, 255, 255, 0.18)";
      ctx.fillRect(left, top + row * cell, cols * cell, cell);
      ctx.fillRect(left + col * cell, top, cell, rows * cell);
      ctx.lineWidth = 2;
      ctx.strokeStyle = "#ff2d55";
      ctx.strokeRect(left + col * cell - 1, top + row * cell - 1, cell + 2, cell + 2);
    }

    clearOverlay() {
      const ctx = this.overlay.getContext("2d");
      ctx.setTransform(1, 0, 0, 1, 0, 0);
      ctx.clearRect(0, 0, this.overlay.width, this.overlay.height);
    }

    toPNG() {
      return this.canvas.toDataURL("image/png");
    }

    // The same drawing as SVG: one <rect> per cell, the word pieces as <text>, the colour bar as 64 bands.
    toSVG(title) {
      const { values, rows, cols, rowLabels, colLabels, colors, pairStart, closed } = this.map;
      const { cell, stride, left, top, barX, barHeight, width, height } = this.layout;
      const out = [`<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" `
        + `viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="11">`,
      `<title>${xmlEscape(title || "attention map")}</title>`, `<rect width="${width}" height="${height}" fill="#fff"/>`,
      `<defs><pattern id="closed" width="6" height="6" patternUnits="userSpaceOnUse"><rect width="6" height="6" `
        + `fill="rgb(${CLOSED_GREY},${CLOSED_GREY},${CLOSED_GREY})"/><path d="M0 6L6 0" stroke="${HATCH_COLOR}"/>`
        + "</pattern></defs>",
      '<g shape-rendering="crispEdges">'];
      for (let i = 0; i < rows; i++) {
        for (let j = 0; j < cols; j++) {
          out.push(`<rect x="${left + j * cell}" y="${top + i * cell}" width="${cell}" height="${cell}" `
            + `fill="${closed && closed(i, j) ? "url(#closed)" : colors.hex(values[i * cols + j], i)}"/>`);
        }
      }
      out.push("</g>");
      if (pairStart !== null && pairStart > 0) {
        const x = left + pairStart * cell, y = top + pairStart * cell;
        out.push(`<path d="M${x} ${top}V${top + rows * cell}M${left} ${y}H${left + cols * cell}" stroke="#fff"/>`);
      }
      out.push('<g fill="#222" text-anchor="end" dominant-baseline="middle">');
      for (let i = 0; i < rows; i += stride) {
        out.push(`<text x="${left - 4}" y="${top + (i + 0.5) * cell}">${xmlEscape(shortLabel(rowLabels[i]))}</text>`);
      }
      out.push("</g>", '<g fill="#222" dominant-baseline="middle">');
      for (let j = 0; j < cols; j += stride) {
        out.push(`<text transform="translate(${left + (j + 0.5) * cell} ${top - 4}) rotate(-90)">`
          + `${xmlEscape(shortLabel(colLabels[j]))}</text>`);
      }
      const bands = 64;
      for (let k = 0; k < bands; k++) {
        const [r, g, b] = colors.barRgb(1 - (k + 0.5) / bands);
        out.push(`<rect x="${barX}" y="${top + (k * barHeight) / bands}" width="${BAR_WIDTH}" `
          + `height="${barHeight / bands + 0.5}" fill="rgb(${r},${g},${b})"/>`);
      }
      for (const [f, label] of colors.ticks()) {
        const y = top + (1 - f) * (barHeight - 1) + 0.5;
        out.push(`<rect x="${barX + BAR_WIDTH}" y="${y - 0.5}" width="4" height="1"/>`,
          `<text x="${barX + BAR_WIDTH + 7}" y="${y}">${xmlEscape(label)}</text>`);
      }
      out.push("</g>", "</svg>");
      return out.join("\n");
    }

    info() {
      if (!this.map) return null;
      const { rows, cols, rowLabels, colLabels, scale, reach, closed } = this.map;
      let closedCount = 0;
      for (let i = 0; closed && i < rows; i++) for (let j = 0; j < cols; j++) closedCount += closed(i, j) ? 1 : 0;
      return { rows, cols, rowLabels, colLabels, scale, reach, closedCount, cell: this.layout.cell,
        drawCount: this.drawCount };
    }
  }

  ns.MapView = MapView;
  ns.describeReach = describeReach;
})(window.attnserveExplorer = window.attnserveExplorer || {});
