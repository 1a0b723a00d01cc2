// The model view: every layer's every head as a small map, layers down and heads across, so that the heads worth
// a closer look stand out (a diagonal, a column on [CLS] or [SEP], a band beside the diagonal). Clicking a map opens
// it in the heatmap. The layers arrive one request each, and their rows fill in as they come.
"use strict";
(function (ns) {
  const { makeScale, rowMaxima } = ns.colors;
  const THUMB = 56;

  class ModelView {
    // onOpen(layer, head): a thumbnail was clicked.
    constructor(container, onOpen) {
      this.container = container;
      this.onOpen = onOpen;
      this.thumbs = new Map(); // "layer,head" -> canvas
    }

    // An empty grid of numLayers x heads thumbnails, each labelled by its layer and head.
    reset(numLayers, heads) {
      this.thumbs.clear();
      const grid = document.createElement("div");
      grid.className = "thumb-grid";
      grid.style.gridTemplateColumns = `auto repeat(${heads.length}, ${THUMB}px)`;
      grid.append(document.createElement("span"));
      for (const head of heads) {
        const label = document.createElement("span");
        label.className = "thumb-head";
        label.textContent = `head ${head}`;
        grid.append(label);
      }
      for (let layer = 0; layer < numLayers; layer++) {
        const label = document.createElement("span");
        label.className = "thumb-layer";
        label.textContent = `layer ${layer}`;
        grid.append(label);
        for (const head of heads) {
          const canvas = document.createElement("canvas");
          canvas.className = "thumb";
          canvas.dataset.layer = String(layer);
          canvas.dataset.head = String(head);
          canvas.title = `layer ${layer}, head ${head}: click to open it in the heatmap`;
          canvas.width = canvas.height = THUMB;
          canvas.addEventListener("click", () => this.onOpen(layer, head));
          this.thumbs.set(`${layer},${head}`, canvas);
          grid.append(canvas);
        }
      }
      this.container.replaceChildren(grid);
    }

    // One layer's row: values [heads, T, T], drawn on the scale the heatmap uses.
    fillLayer(layer, values, heads, T, scaleKind) {
      const pixels = document.createElement("canvas");
      pixels.width = pixels.height = T;
      const pctx = pixels.getContext("2d");
      heads.forEach((head, h) => {
        const canvas = this.thumbs.get(`${layer},${head}`);
        if (!canvas) return;
        const map = values.subarray(h * T * T, (h + 1) * T * T);
        const colors = makeScale(scaleKind, 1, scaleKind === "row" ? rowMaxima(map, T, T) : null);
        const image = pctx.createImageData(T, T);
        for (let k = 0; k < T * T; k++) {
          const c = colors.index(map[k], Math.floor(k / T)) * 3;
          image.data[k * 4] = colors.table[c];
          image.data[k * 4 + 1] = colors.table[c + 1];
          image.data[k * 4 + 2] = colors.table[c + 2];
          image.data[k * 4 + 3] = 255;
        }
        pctx.putImageData(image, 0, 0);
        const ctx = canvas.getContext("2d");
        // averaged when shrunk (more tokens than pixels), crisp blocks when enlarged
        ctx.imageSmoothingEnabled = T > THUMB;
        ctx.imageSmoothingQuality = "high";
        ctx.drawImage(pixels, 0, 0, THUMB, THUMB);
        canvas.dataset.drawn = "true";
      });
    }
  }

  ns.ModelView = ModelView;
})(window.attnserveExplorer = window.attnserveExplorer || {});
