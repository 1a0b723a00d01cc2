// The head view (after BertViz, Vig 2019): the word pieces in two columns, queries on the left and keys on the
// right, a line from each query to the keys it attends to, one colour per head, the line's opacity its weight.
// A checkbox per head shows or hides its lines; hovering a token shows only its own lines (a query's to its keys,
// a key's from its queries).
//
// Lines under MIN_WEIGHT are not drawn: at that opacity they cannot be seen, and a 512-token input would otherwise
// ask for heads x 262,144 strokes. Opacities are drawn in ALPHA_STEPS steps, one path per head and step, so that
// the canvas strokes a few hundred paths rather than a path per line.
"use strict";
(function (ns) {
  const { headColor } = ns.colors;
  const { sizedCanvas } = ns.canvas;
  const ROW = 18, HEADER = 30, PAD = 10, GAP = 240, MAX_LABEL_PX = 150, FONT = "12px sans-serif";
  const MIN_WEIGHT = 0.01, ALPHA_STEPS = 32;

  class HeadView {
    // container: where the canvas goes; toggles: where the heads' checkboxes go.
    constructor(container, toggles) {
      this.container = container;
      this.toggles = toggles;
      this.canvas = document.createElement("canvas");
      container.replaceChildren(this.canvas);
      this.data = null;
      this.active = new Set();
      this.focus = null; // {side: "left" | "right", index}
      this.lines = 0;
      this.canvas.addEventListener("mousemove", (e) => this.hover(e.clientX, e.clientY));
      this.canvas.addEventListener("mouseleave", () => this.setFocus(null));
    }

    // values: Float32Array [heads, T, T] of one layer; heads: the head numbers of its blocks.
    show({ tokens, values, heads, layer, pairStart = null }) {
      const sameHeads = this.data && this.data.heads.join() === heads.join();
      this.data = { tokens, values, heads, layer, pairStart, T: tokens.length };
      if (!sameHeads) {
        this.active = new Set(heads);
        this.buildToggles();
      }
      this.focus = null;
      this.layout = this.computeLayout();
      this.draw();
    }

    buildToggles() {
      const items = this.data.heads.map((head) => {
        const label = document.createElement("label");
        label.className = "head-toggle";
        const box = document.createElement("input");
        box.type = "checkbox";
        box.id = `head-toggle-${head}`;
        box.checked = true;
        box.addEventListener("change", () => {
          if (box.checked) this.active.add(head);
          else this.active.delete(head);
          this.draw();
        });
        const swatch = document.createElement("span");
        swatch.className = "swatch";
        swatch.style.background = headColor(head);
        label.append(box, swatch, `head ${head}`);
        return label;
      });
      const all = document.createElement("button");
      all.type = "button";
      all.id = "head-toggle-all";
      all.textContent = "all";
      all.addEventListener("click", () => this.setHeads(this.data.heads));
      const none = document.createElement("button");
      none.type = "button";
      none.id = "head-toggle-none";
      none.textContent = "none";
      none.addEventListener("click", () => this.setHeads([]));
      this.toggles.replaceChildren(...items, all, none);
    }

    setHeads(heads) {
      this.active = new Set(heads);
      for (const head of this.data.heads) document.getElementById(`head-toggle-${head}`).checked = this.active.has(head);
      this.draw();
    }

    computeLayout() {
      const ctx = this.canvas.getContext("2d");
      ctx.font = FONT;
      const widest = Math.min(MAX_LABEL_PX, Math.max(...this.data.tokens.map((t) => ctx.measureText(t).width)));
      const leftX = PAD + Math.ceil(widest), lineStart = leftX + 8, lineEnd = lineStart + GAP;
      const rightX = lineEnd + 8;
      return { leftX, lineStart, lineEnd, rightX, width: rightX + Math.ceil(widest) + PAD,
        height: HEADER + this.data.T * ROW + PAD };
    }

    rowY(i) {
      return HEADER + (i + 0.5) * ROW;
    }

    draw() {
      const { width, height, leftX, lineStart, lineEnd, rightX } = this.layout;
      const { tokens, values, heads, T, layer } = this.data;
      const ctx = sizedCanvas([this.canvas], width, height);
      ctx.font = "bold " + FONT;
      ctx.fillStyle = "#222222";
      ctx.textBaseline = "middle";
      ctx.textAlign = "center";
      ctx.fillText(`layer ${layer}: queries → keys`, width / 2, HEADER / 2);
      // the lines
      let lines = 0;
      ctx.lineWidth = 1.5;
      const focus = this.focus;
      for (let h = 0; h < heads.length; h++) {
        if (!this.active.has(heads[h])) continue;
        const paths = new Map(); // opacity step -> Path2D
        const base = h * T * T;
        const [i0, i1] = focus && focus.side === "left" ? [focus.index, focus.index + 1] : [0, T];
        for (let i = i0; i < i1; i++) {
          const [j0, j1] = focus && focus.side === "right" ? [focus.index, focus.index + 1] : [0, T];
          for (let j = j0; j < j1; j++) {
            const w = values[base + i * T + j];
            if (!(w >= MIN_WEIGHT)) continue;
            const step = Math.max(1, Math.min(ALPHA_STEPS, Math.round(w * ALPHA_STEPS)));
            if (!paths.has(step)) paths.set(step, new Path2D());
            const path = paths.get(step);
            path.moveTo(lineStart, this.rowY(i));
            path.lineTo(lineEnd, this.rowY(j));
            lines += 1;
          }
        }
        ctx.strokeStyle = headColor(heads[h]);
        for (const [step, path] of paths) {
          ctx.globalAlpha = step / ALPHA_STEPS;
          ctx.stroke(path);
        }
      }
      ctx.globalAlpha = 1;
      this.lines = lines;
      // the word pieces, the focused one highlighted
      ctx.font = FONT;
      for (let i = 0; i < T; i++) {
        for (const [side, x, align] of [["left", leftX, "right"], ["right", rightX, "left"]]) {
          const focused = focus && focus.side === side && focus.index === i;
          if (focused) {
            const w = Math.min(MAX_LABEL_PX, ctx.measureText(tokens[i]).width) + 6;
            ctx.fillStyle = "#ffe9a8";
            ctx.fillRect(align === "right" ? x - w + 3 : x - 3, this.rowY(i) - ROW / 2 + 1, w, ROW - 2);
          }
          ctx.fillStyle = this.data.pairStart !== null && i >= this.data.pairStart ? "#7a3e9d" : "#222222";
          ctx.textAlign = align;
          ctx.fillText(tokens[i], x, this.rowY(i), MAX_LABEL_PX);
        }
      }
    }

    // The token under a pointer: {side, index}, or null between the columns and outside them.
    tokenAt(clientX, clientY) {
      const rect = this.canvas.getBoundingClientRect();
      const x = clientX - rect.left, y = clientY - rect.top;
      const index = Math.floor((y - HEADER) / ROW);
      if (!this.data || index < 0 || index >= this.data.T) return null;
      if (x <= this.layout.lineStart) return { side: "left", index };
      if (x >= this.layout.lineEnd) return { side: "right", index };
      return null;
    }

    // The client coordinates of a token's label: where a pointer must be to focus it.
    tokenCenter(side, index) {
      const rect = this.canvas.getBoundingClientRect();
      const x = side === "left" ? this.layout.leftX - 10 : this.layout.rightX + 10;
      return { x: rect.left + x, y: rect.top + this.rowY(index) };
    }

    hover(clientX, clientY) {
      this.setFocus(this.tokenAt(clientX, clientY));
    }

    setFocus(focus) {
      const same = (a, b) => (a === null ? b === null : b !== null && a.side === b.side && a.index === b.index);
      if (!this.data || same(this.focus, focus)) return;
      this.focus = focus;
      this.draw();
    }

    state() {
      if (!this.data) return null;
      return { layer: this.data.layer, activeHeads: this.data.heads.filter((h) => this.active.has(h)),
        lines: this.lines, focus: this.focus };
    }
  }

  ns.HeadView = HeadView;
})(window.attnserveExplorer = window.attnserveExplorer || {});
