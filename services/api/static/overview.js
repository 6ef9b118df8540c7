// The overview: live message rates, connections and node health, polling
// the API once a second (three GETs: /metrics, /stats, /nodes).
//
// Rates are made here from the node's counters: (now - before) / elapsed,
// between two polls. A counter that went down (the node restarted) gives
// no point rather than a negative rate. The charts keep the last WINDOW_S
// seconds (uPlot, vendored in vendor/: about 50 kB, drawn on a canvas).

/* global uPlot */

import { call } from "./api.js";
import { bytes, duration, el, link, table } from "./ui.js";

const WINDOW_S = 120; // the charts show the last two minutes, sliding
const COLOURS = ["#2563eb", "#16a34a", "#dc2626", "#9333ea"];

// Tick steps of a count axis: whole numbers only (no "0.5 connections").
const WHOLE = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6];

// A time-series chart: lines [{ label, dashed? }] (dashed: one that often
// lies on another); push(t, values) adds a point. unit(v) writes a tick of
// the y axis; whole: ticks at whole numbers only.
function chart(title, lines, unit, whole = false) {
  const holder = el("div", { class: "chart" });
  const data = [[], ...lines.map(() => [])];
  let plot = null;

  function options() {
    return {
      width: Math.max(holder.clientWidth, 300),
      height: 200,
      legend: { live: false },
      cursor: { drag: { x: false, y: false } },
      scales: {
        x: { time: true, range: (u, min, max) => [max - WINDOW_S, max] },
        y: { range: (u, min, max) => [0, Math.max(max * 1.1, 1)] },
      },
      axes: [
        { values: "{HH}:{mm}:{ss}" },
        { size: 80, values: (u, ticks) => ticks.map(unit), ...(whole ? { incrs: WHOLE } : {}) },
      ],
      series: [{}, ...lines.map((line, i) => ({
        label: line.label, stroke: COLOURS[i], width: 2, dash: line.dashed ? [8, 6] : undefined,
      }))],
    };
  }
  return {
    element: el("section", { class: "panel" }, el("h3", {}, title), holder),
    push(t, values) {
      data[0].push(t);
      values.forEach((v, i) => data[i + 1].push(v));
      while (data[0][0] < t - WINDOW_S) data.forEach((column) => column.shift());
      if (plot === null) plot = new uPlot(options(), data, holder);
      else plot.setData(data);
    },
    resize() {
      if (plot !== null) plot.setSize({ width: Math.max(holder.clientWidth, 300), height: 200 });
    },
  };
}

function figure(id, label) {
  return el("div", { class: "figure" }, el("span", { class: "value", id }, "–"), el("span", {}, label));
}

function set(id, text) {
  document.getElementById(id).textContent = text;
}

const perSecond = (v) => (v >= 100 ? v.toFixed(0) : v.toFixed(1));
const count = (v) => Math.round(v).toLocaleString();

export async function overview(main, page) {
  const lines = (...labels) => labels.map((label) => ({ label }));
  const rates = chart("Messages per second (this node)",
    [...lines("in", "out"), { label: "dropped", dashed: true }], perSecond);
  const connections = chart("Connections",
    [{ label: "live (this node)" }, { label: "sessions (cluster)", dashed: true }], count, true);
  const memory = chart("Memory (this node)", lines("resident"), (v) => bytes(v));
  const lag = chart("Event loop lag (this node)", lines("lag"), (v) => `${v.toFixed(1)} ms`);
  const nodes = el("div");
  main.append(
    el("h2", {}, "Overview"),
    el(
      "div",
      { class: "figures" },
      figure("rate-in", "messages in / s"),
      figure("rate-out", "messages out / s"),
      figure("live-connections", "connections"),
      figure("sessions", "sessions (cluster)"),
      figure("subscriptions", "subscriptions"),
      figure("retained", "retained"),
      figure("alarms", "alarms active"),
    ),
    el("div", { class: "charts" }, rates.element, connections.element, memory.element, lag.element),
    el("h3", {}, "Nodes"),
    nodes,
  );
  const charts = [rates, connections, memory, lag];
  page.on(window, "resize", () => charts.forEach((c) => c.resize()));

  let before = null;
  page.every(1000, async () => {
    const [[metrics], [stats], nodeList] = await Promise.all([
      call("GET", "/metrics"),
      call("GET", "/stats"),
      call("GET", "/nodes"),
    ]);
    const now = Date.now() / 1000;
    const counters = {
      in: metrics["messages.received"],
      out: metrics["messages.sent"],
      dropped: metrics["messages.dropped"],
    };
    if (before !== null && now > before.t) {
      const rate = (name) => (counters[name] - before[name]) / (now - before.t);
      const values = [rate("in"), rate("out"), rate("dropped")];
      if (values.every((v) => v >= 0)) {
        rates.push(now, values);
        set("rate-in", perSecond(values[0]));
        set("rate-out", perSecond(values[1]));
      }
    }
    before = { t: now, ...counters };
    connections.push(now, [stats["live_connections.count"], stats["cluster.sessions.count"]]);
    const own = nodeList.find((n) => n.node === metrics.node) || nodeList[0];
    memory.push(now, [own.memory_used || 0]);
    lag.push(now, [(metrics["eventloop.lag.seconds"] || 0) * 1000]);
    set("live-connections", count(stats["live_connections.count"]));
    set("sessions", count(stats["cluster.sessions.count"]));
    set("subscriptions", count(stats["subscriptions.count"]));
    set("retained", count(stats["retained.count"]));
    set("alarms", count(metrics["alarms.active"] || 0));
    nodes.replaceChildren(nodeTable(nodeList));
  });
}

export function nodeTable(rows) {
  return table(
    [
      { title: "Node", value: (n) => n.node },
      { title: "Status", value: (n) => n.node_status, class: "status" },
      { title: "Version", value: (n) => n.version },
      { title: "Uptime", value: (n) => duration(n.uptime) },
      { title: "Sessions", value: (n) => n.connections },
      { title: "Connections", value: (n) => n.live_connections },
      { title: "Memory", value: (n) => bytes(n.memory_used) },
      { title: "Max open files", value: (n) => n.max_fds },
      { title: "Peers", value: (n) => (n.peers ? n.peers.join(", ") : "") },
      { title: "", value: (n) => link(`#/clients?node=${encodeURIComponent(n.node)}`, "clients") },
    ],
    rows,
  );
}
