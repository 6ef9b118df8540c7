// Small DOM helpers the pages share: elements, tables, paged lists, notices.
//
// Data from the API (client ids, topics, payloads) only ever becomes text
// nodes or attribute values, never HTML, so a client id such as
// "<img onerror=...>" shows as itself.

import { call } from "./api.js";

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value === true) node.setAttribute(name, "");
    else if (value !== false && value !== null && value !== undefined) node.setAttribute(name, value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

export function button(label, onclick, attrs = {}) {
  return el("button", { type: "button", onclick: () => attempt(onclick()), ...attrs }, label);
}

// The page's message line: what an action did, or why it failed.
export function notice(text, kind = "info") {
  const box = document.getElementById("notice");
  box.className = `notice ${kind}`;
  box.textContent = text;
  box.hidden = !text;
}

// Run an action's promise; its failure becomes the notice (a refused key is
// handled by the app, which shows the login form).
export async function attempt(promise) {
  try {
    return await promise;
  } catch (err) {
    if (err.status !== 401) notice(err.code ? `${err.code}: ${err.message}` : String(err), "error");
    return undefined;
  }
}

// columns: [{ title, value: (row) => text or Node, class? }]; no titles: no header row
export function table(columns, rows, empty = "Nothing to show.") {
  if (rows.length === 0) return el("p", { class: "empty" }, empty);
  const titled = columns.some((c) => c.title);
  return el(
    "table",
    { class: titled ? null : "fields" },
    titled ? el("thead", {}, el("tr", {}, columns.map((c) => el("th", {}, c.title)))) : null,
    el(
      "tbody",
      {},
      rows.map((row) =>
        el("tr", {}, columns.map((c) => el("td", { class: c.class }, show(c.value(row))))),
      ),
    ),
  );
}

function show(value) {
  if (value === null || value === undefined) return "";
  if (value instanceof Node) return value;
  if (typeof value === "boolean") return value ? "yes" : "no";
  return String(value);
}

// A filter form: fields [{ name, label, options?, type?, value? }]; submit calls
// onsearch({name: value, ...}) with the fields that are set.
export function filterForm(fields, onsearch, submitLabel = "Search") {
  const inputs = fields.map((f) =>
    f.options
      ? el("select", { name: f.name }, f.options.map(([value, text]) => el("option", { value }, text)))
      : el("input", { name: f.name, type: f.type || "text", value: f.value }),
  );
  const form = el(
    "form",
    { class: "filters" },
    fields.map((f, i) => el("label", {}, f.label, inputs[i])),
    el("button", { type: "submit" }, submitLabel),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const values = {};
    for (const input of inputs) {
      // A password is taken as typed; other fields without their outer spaces.
      const value = input.type === "password" ? input.value : input.value.trim();
      if (value !== "") values[input.name] = value;
    }
    attempt(onsearch(values));
  });
  return form;
}

// A paginated list of an /api/v5 endpoint ({data, meta} answers): a table,
// "1-50 of 1,234" and previous / next.
export function pagedList(path, columns, { limit = 50, empty } = {}) {
  const body = el("div", { class: "list" });
  const info = el("span", { class: "meta" });
  const prev = el("button", { type: "button" }, "Previous");
  const next = el("button", { type: "button" }, "Next");
  let page = 1;
  let filters = {};

  async function load() {
    const { data, meta } = await call("GET", path, { query: { ...filters, page, limit } });
    body.replaceChildren(table(columns, data, empty));
    const first = (meta.page - 1) * meta.limit + 1;
    info.textContent = data.length
      ? `${first}-${first + data.length - 1} of ${meta.count.toLocaleString()}`
      : `${meta.count.toLocaleString()} in all`;
    prev.disabled = page <= 1;
    next.disabled = !meta.hasnext;
  }
  prev.addEventListener("click", () => {
    page -= 1;
    attempt(load());
  });
  next.addEventListener("click", () => {
    page += 1;
    attempt(load());
  });
  return {
    element: el("div", {}, body, el("div", { class: "pager" }, prev, info, next)),
    search(wanted) {
      filters = wanted;
      page = 1;
      return load();
    },
    reload: load,
  };
}

export function link(href, text) {
  return el("a", { href }, text);
}

export function time(iso) {
  return iso ? new Date(iso).toLocaleString() : "";
}

export function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function duration(ms) {
  if (ms === null || ms === undefined) return "";
  const s = Math.floor(ms / 1000);
  const parts = [[Math.floor(s / 86400), "d"], [Math.floor(s / 3600) % 24, "h"],
    [Math.floor(s / 60) % 60, "m"], [s % 60, "s"]];
  const from = parts.findIndex(([n]) => n > 0);
  return from < 0 ? "0s" : parts.slice(from, from + 2).map(([n, u]) => n + u).join(" ");
}

export function protocol(level) {
  return { 3: "3.1", 4: "3.1.1", 5: "5.0" }[level] || "";
}
