// The head statistics (docs/attention.md, Analyses): one small layers x heads grid per statistic, each cell
// coloured from the statistic's lowest value (dark) to its highest (yellow), its number shown on hover.
"use strict";
(function (ns) {
  const { makeScale, formatValue } = ns.colors;
  // The server's statistics in the order docs/attention.md lists them, with what a row i contributes.
  const STATISTICS = [
    ["entropy", "−Σ_j a_ij ln a_ij, in nats"],
    ["normalized_entropy", "entropy ÷ ln(the keys the row attends to)"],
    ["first_special", "the weight on the first special token ([CLS], <s>)"],
    ["separators", "the weights on the special tokens after it ([SEP], </s>)"],
    ["self", "a_ii, the weight on the token itself"],
    ["previous", "a_i,i−1, the weight on the token before"],
    ["next", "a_i,i+1, the weight on the token after"],
    ["distance", "Σ_j a_ij·|i − j|, in tokens"],
    ["a_to_b", "the share of segment a's rows on segment b's tokens"],
    ["b_to_a", "the share of segment b's rows on segment a's tokens"],
  ];

  // headStats: name -> Float32Array [layers, heads]; readout: the element that says a hovered cell's number.
  function renderStats(container, readout, headStats, numLayers, heads) {
    const figures = [];
    const known = new Set(STATISTICS.map(([name]) => name));
    const names = [...STATISTICS, ...Object.keys(headStats).filter((n) => !known.has(n)).map((n) => [n, ""])];
    for (const [name, definition] of names) {
      const grid = headStats[name];
      if (!grid) continue;
      let lo = Infinity, hi = -Infinity;
      for (const v of grid) {
        lo = Math.min(lo, v);
        hi = Math.max(hi, v);
      }
      const colors = makeScale("fixed", 1);
      const figure = document.createElement("figure");
      figure.className = "stat";
      figure.id = `stat-${name}`;
      const caption = document.createElement("figcaption");
      const title = document.createElement("strong");
      title.textContent = name;
      const range = document.createElement("span");
      range.className = "range";
      range.textContent = `(${formatShortRange(lo, hi)})`;
      caption.append(title, ` ${definition} `, range);
      const table = document.createElement("table");
      const head = table.createTHead().insertRow();
      head.insertCell().textContent = "";
      for (const h of heads) head.insertCell().textContent = String(h);
      const body = table.createTBody();
      for (let layer = 0; layer < numLayers; layer++) {
        const row = body.insertRow();
        row.insertCell().textContent = String(layer);
        heads.forEach((h, k) => {
          const value = grid[layer * heads.length + k];
          const cell = row.insertCell();
          cell.className = "stat-cell";
          cell.style.background = colors.hex(hi > lo ? (value - lo) / (hi - lo) : 0.5);
          cell.dataset.value = formatValue(value);
          cell.dataset.layer = String(layer);
          cell.dataset.head = String(h);
          cell.title = `${name}, layer ${layer}, head ${h}: ${formatValue(value)}`;
          cell.addEventListener("mouseenter", () => {
            readout.textContent = cell.title;
            readout.dataset.value = cell.dataset.value;
          });
        });
      }
      figure.append(caption, table);
      figures.push(figure);
    }
    container.replaceChildren(...figures);
  }

  function formatShortRange(lo, hi) {
    return `${ns.colors.formatShort(lo)} to ${ns.colors.formatShort(hi)}`;
  }

  ns.renderStats = renderStats;
})(window.attnserveExplorer = window.attnserveExplorer || {});
