// The dashboard's shell: the login form, the navigation and the router.
//
// Pages are addressed by the URL's hash (#/clients, #/clients/<id>,
// #/nodes...), so a reload or a bookmark opens the same page and the server
// serves one file. Leaving a page ends what it started: its timers and its
// window listeners (`Page`). A page whose endpoint this node's API does not
// declare (an older or newer node) says so instead of failing.

import { ApiError, forget, has, login, saved } from "./api.js";
import { overview } from "./overview.js";
import {
  alarms, banned, client, clients, listeners, nodes, plugins, retained, subscriptions, topics,
  users,
} from "./pages.js";
import { el, notice } from "./ui.js";

// [hash name, title, render, the GET endpoint it needs]
const PAGES = [
  ["overview", "Overview", overview, "/metrics"],
  ["clients", "Clients", clients, "/clients"],
  ["subscriptions", "Subscriptions", subscriptions, "/subscriptions"],
  ["topics", "Topics", topics, "/topics"],
  ["retained", "Retained", retained, "/mqtt/retainer/messages"],
  ["banned", "Banned", banned, "/banned"],
  ["users", "Users", users, "/authentication/{backend}/users"],
  ["alarms", "Alarms", alarms, "/alarms"],
  ["nodes", "Nodes", nodes, "/nodes"],
  ["listeners", "Listeners", listeners, "/listeners"],
  ["plugins", "Plugins", plugins, "/plugins"],
];

// What one visit of a page started, ended when the user leaves it.
class Page {
  constructor(query) {
    this.query = query;
    this.live = true;
    this.stops = [];
  }

  // Run `task` now, then `ms` after each run ends (never two at once),
  // until the page is left. A failure shows and the polling goes on.
  every(ms, task) {
    let timer = null;
    const run = async () => {
      try {
        await task();
        if (this.live) notice("");
      } catch (err) {
        if (this.live && err.status !== 401) notice(`${err.code || "ERROR"}: ${err.message}`, "error");
      }
      if (this.live) timer = setTimeout(run, ms);
    };
    this.stops.push(() => clearTimeout(timer));
    run();
  }

  on(target, event, handler) {
    target.addEventListener(event, handler);
    this.stops.push(() => target.removeEventListener(event, handler));
  }

  leave() {
    this.live = false;
    this.stops.forEach((stop) => stop());
  }
}

const $ = (id) => document.getElementById(id);
let current = null;

function parse() {
  const [path, search] = location.hash.replace(/^#\/?/, "").split("?");
  const [name, ...rest] = path.split("/");
  return {
    name: name || "overview",
    arg: rest.length ? decodeURIComponent(rest.join("/")) : null,
    query: Object.fromEntries(new URLSearchParams(search || "")),
  };
}

async function route() {
  if (current !== null) current.leave();
  const { name, arg, query } = parse();
  const page = new Page(query);
  current = page;
  const found = PAGES.find(([hash]) => hash === name) || PAGES[0];
  const [hash, title, render, needs] = found;
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("here", a.dataset.page === hash);
  }
  document.title = `${title} · Weir`;
  notice("");
  const main = el("main", { id: "page", "data-hash": location.hash });
  $("page").replaceWith(main);
  if (!has("GET", needs)) {
    main.append(el("h2", {}, title), el("p", { class: "unavailable" },
      `Not available: this node's API has no GET /api/v5${needs} (see its /api/v5/openapi.json).`));
    return;
  }
  try {
    if (hash === "clients" && arg !== null) await client(main, page, arg);
    else await render(main, page, arg);
  } catch (err) {
    if (page.live && err.status !== 401) notice(`${err.code || "ERROR"}: ${err.message}`, "error");
  }
}

function showLogin(message) {
  if (current !== null) current.leave();
  current = null;
  $("app").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("login-key").focus();
}

function showApp() {
  $("login").hidden = true;
  $("app").hidden = false;
  $("who").textContent = `key ${saved().split(":")[0]}`;
  route();
}

async function enter(pair) {
  try {
    await login(pair);
  } catch (err) {
    forget();
    if (err.status === 401) showLogin(`Wrong key or secret (${err.message}).`);
    else showLogin(err instanceof ApiError ? `${err.code}: ${err.message}` : String(err));
    return;
  }
  showApp();
}

function start() {
  $("nav-links").replaceChildren(
    ...PAGES.map(([hash, title]) => el("a", { href: `#/${hash}`, "data-page": hash }, title)),
  );
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("login-key").value.trim();
    const secret = $("login-secret").value;
    $("login-secret").value = "";
    if (!key || !secret || key.includes(":")) {
      showLogin("Give the API key and its secret (the two halves of a key:secret line).");
      return;
    }
    enter(`${key}:${secret}`);
  });
  $("logout").addEventListener("click", () => {
    forget();
    showLogin("Logged out.");
  });
  window.addEventListener("hashchange", () => {
    if (saved()) route();
  });
  window.addEventListener("weir:unauthorized", (event) => {
    forget();
    showLogin(`The node refused the key: ${event.detail} Log in again.`);
  });
  const pair = saved();
  if (pair) enter(pair);
  else showLogin("");
}

start();
