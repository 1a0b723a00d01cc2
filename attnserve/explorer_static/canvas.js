// A canvas drawn sharp on any screen: its bitmap in device pixels (devicePixelRatio of them to a CSS pixel), its box
// in CSS pixels, and the drawing in CSS pixels too. The map and the head view size theirs here before each draw.
"use strict";
(function (ns) {
  // Every canvas given (width, height) CSS pixels; returns the first one's 2D context, scaled to CSS pixels and
  // filled white (a PNG saved from it has no transparent background).
  function sizedCanvas(canvases, width, height) {
    const ratio = window.devicePixelRatio || 1;
    for (const c of canvases) {
      c.width = Math.round(width * ratio);
      c.height = Math.round(height * ratio);
      c.style.width = `${width}px`;
      c.style.height = `${height}px`;
    }
    const ctx = canvases[0].getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, width, height);
    return ctx;
  }

  ns.canvas = { sizedCanvas };
})(window.attnserveExplorer = window.attnserveExplorer || {});
