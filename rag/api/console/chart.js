// ragserve console: the recall-versus-latency chart, an inline SVG drawn from `rag tune`'s
// measurements (no charting library).

import { clear, svg } from "./dom.js";

function niceStep(span) {
  const raw = span / 5;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * mag;
}

function niceCeil(v) {
  const step = niceStep(v);
  return Math.ceil(v / step) * step;
}

function ticks(lo, hi) {
  const step = niceStep(hi - lo);
  const out = [];
  for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + 1e-9; v += step) out.push(v);
  return out;
}

function fmt(v) {
  return Math.abs(v) >= 10 || Number.isInteger(v) ? String(Math.round(v)) : v.toFixed(1);
}

// The recall-versus-p99-latency curve as an inline SVG.
export function drawChart(box, t, current, selected, onPick) {
  clear(box);
  const W = 640, H = 380, L = 58, R = 18, T = 18, B = 46;
  const pts = t.points;
  const xs = pts.map((p) => p.p99_ms);
  const ys = pts.map((p) => p.recall).concat([t.target_recall]);
  const x0 = 0, x1 = niceCeil(Math.max(...xs, 0.001) * 1.05);
  let y0 = Math.max(0, Math.min(...ys) - 0.05), y1 = 1.0;
  if (y1 - y0 < 0.05) y0 = y1 - 0.05;
  const sx = (v) => L + ((v - x0) / (x1 - x0)) * (W - L - R);
  const sy = (v) => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
  const s = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "recall versus p99 latency" });

  for (const yv of ticks(y0, y1)) {
    s.appendChild(svg("line", { class: "grid-line", x1: L, x2: W - R, y1: sy(yv), y2: sy(yv) }));
    s.appendChild(svg("text", { x: L - 6, y: sy(yv) + 4, "text-anchor": "end" }, yv.toFixed(2)));
  }
  for (const xv of ticks(x0, x1)) {
    s.appendChild(svg("line", { class: "grid-line", x1: sx(xv), x2: sx(xv), y1: T, y2: H - B }));
    s.appendChild(svg("text", { x: sx(xv), y: H - B + 16, "text-anchor": "middle" }, fmt(xv)));
  }
  s.appendChild(svg("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  s.appendChild(svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
  s.appendChild(svg("text", { x: (L + W - R) / 2, y: H - 8, "text-anchor": "middle" }, "p99 latency per search (ms)"));
  s.appendChild(
    svg("text", { x: 14, y: (T + H - B) / 2, "text-anchor": "middle", transform: "rotate(-90 14 " + (T + H - B) / 2 + ")" },
      "recall@" + t.k)
  );
  const ty = sy(t.target_recall);
  s.appendChild(svg("line", { class: "target", x1: L, x2: W - R, y1: ty, y2: ty }));
  s.appendChild(svg("text", { x: W - R - 4, y: ty - 5, "text-anchor": "end" }, "target " + t.target_recall));

  const order = pts.map((p, i) => i).sort((a, b) => (pts[a].value ?? 0) - (pts[b].value ?? 0));
  const d = order.map((i, j) => (j ? "L" : "M") + sx(pts[i].p99_ms).toFixed(1) + " " + sy(pts[i].recall).toFixed(1)).join(" ");
  if (pts.length > 1) s.appendChild(svg("path", { class: "curve", d }));

  const labelled = [];
  pts.forEach((p, i) => {
    const cx = sx(p.p99_ms), cy = sy(p.recall);
    if (i === current) {
      s.appendChild(svg("circle", { class: "current-ring", cx, cy, r: 11 }));
      // Keep the label inside the plot: to the left of points near the right edge.
      const left = cx > W * 0.7;
      s.appendChild(
        svg("text", { class: "label-current", x: left ? cx - 14 : cx + 14, y: cy + 18, "text-anchor": left ? "end" : "start" },
          "current default")
      );
    }
    const dot = svg("circle", {
      class: "pt" + (i === selected ? " selected" : "") + (i === current ? " current" : ""),
      cx, cy, r: 6, "data-index": i,
      onclick: () => p.knob && onPick(i),
    });
    dot.appendChild(svg("title", {}, (p.knob ? p.knob + "=" + p.value + ": " : "") +
      "recall " + p.recall.toFixed(3) + ", p99 " + p.p99_ms.toFixed(2) + " ms"));
    s.appendChild(dot);
    // Label a point with its knob value unless another label is already there.
    const free = labelled.every(([x, y]) => Math.abs(x - cx) > 26 || Math.abs(y - cy) > 14);
    if (p.value !== null && p.value !== undefined && (free || i === selected || i === current)) {
      s.appendChild(svg("text", { x: cx + 6, y: cy - 9 }, String(p.value)));
      labelled.push([cx, cy]);
    }
  });
  box.appendChild(s);
}

// Scores below 1 need two decimals (0.05 is not 0.1).
function fine(v) {
  return Math.abs(v) < 1 && !Number.isInteger(v) ? v.toFixed(2) : fmt(v);
}

// Time series as lines over a shared time axis: `series` is [{name, values}], values may be
// null (no answers in that bucket: the line breaks there).
export function drawSeries(box, labels, series, yLabel) {
  clear(box);
  const W = 640, H = 260, L = 58, R = 18, T = 30, B = 40;
  const all = series.flatMap((s) => s.values).filter((v) => v !== null && v !== undefined);
  const y1 = niceCeil(Math.max(...all, 0.001) * 1.05);
  const n = Math.max(labels.length, 2);
  const sx = (i) => L + (i / (n - 1)) * (W - L - R);
  const sy = (v) => T + (1 - v / y1) * (H - T - B);
  const s = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": yLabel });
  for (const yv of ticks(0, y1)) {
    s.appendChild(svg("line", { class: "grid-line", x1: L, x2: W - R, y1: sy(yv), y2: sy(yv) }));
    s.appendChild(svg("text", { x: L - 6, y: sy(yv) + 4, "text-anchor": "end" }, fine(yv)));
  }
  s.appendChild(svg("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  s.appendChild(svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
  const every = Math.max(1, Math.ceil(labels.length / 6));
  labels.forEach((label, i) => {
    if (i % every === 0) s.appendChild(svg("text", { x: sx(i), y: H - B + 16, "text-anchor": "middle" }, label));
  });
  s.appendChild(svg("text", { x: 14, y: (T + H - B) / 2, "text-anchor": "middle",
    transform: "rotate(-90 14 " + (T + H - B) / 2 + ")" }, yLabel));
  series.forEach((line, k) => {
    let d = "";
    let pen = false;
    line.values.forEach((v, i) => {
      if (v === null || v === undefined) { pen = false; return; }
      d += (pen ? "L" : "M") + sx(i).toFixed(1) + " " + sy(v).toFixed(1) + " ";
      pen = true;
      const dot = svg("circle", { class: "s" + k, cx: sx(i), cy: sy(v), r: 2.5, "data-series": line.name });
      dot.appendChild(svg("title", {}, line.name + ": " + fine(v) + " (" + labels[i] + ")"));
      s.appendChild(dot);
    });
    if (d) s.appendChild(svg("path", { class: "series s" + k, d, "data-series": line.name }));
    const lx = L + 8 + k * 130;
    const g = svg("g", { class: "legend" });
    g.appendChild(svg("rect", { class: "s" + k, x: lx, y: 8, width: 12, height: 4 }));
    g.appendChild(svg("text", { x: lx + 16, y: 14 }, line.name));
    s.appendChild(g);
  });
  box.appendChild(s);
}
