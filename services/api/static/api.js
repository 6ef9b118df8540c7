// The dashboard's client of the management API (docs/api.md).
//
// Every call carries the API key the user logged in with, as the standard
// Basic form (base64 of "key:secret", UTF-8). The pair lives in
// sessionStorage: it survives a reload, not the tab. fetch() runs with
// credentials "omit": the browser then never answers the API's 401
// (WWW-Authenticate: Basic) with its own login prompt; the page shows its
// own form instead.
//
// Which endpoints exist is read from the node's OpenAPI document at login,
// so a page whose endpoint this version of the API lacks says so instead of
// failing on a 404.

const STORE = "weir.apikey";
const BASE = "api/v5"; // relative: the page may sit under a proxy's prefix

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export class Unauthorized extends ApiError {}

let declared = null; // "GET /api/v5/clients", ... from the OpenAPI document

export function saved() {
  return sessionStorage.getItem(STORE);
}

export function forget() {
  sessionStorage.removeItem(STORE);
  declared = null;
}

function basic(pair) {
  let binary = "";
  for (const byte of new TextEncoder().encode(pair)) binary += String.fromCharCode(byte);
  return "Basic " + btoa(binary);
}

// One request: the JSON answer (or text, or null for 204); ApiError with the
// API's code and message otherwise, Unauthorized for a 401.
export async function call(method, path, { query = {}, body, pair = saved() } = {}) {
  const url = new URL(BASE + path, document.baseURI);
  for (const [name, value] of Object.entries(query)) {
    // The API refuses undeclared or empty parameters: send only the ones set.
    if (value !== "" && value !== null && value !== undefined) url.searchParams.set(name, value);
  }
  const init = { method, credentials: "omit", cache: "no-store", headers: {} };
  if (pair) init.headers.Authorization = basic(pair);
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (err) {
    throw new ApiError(0, "UNREACHABLE", `the node does not answer (${err.message})`);
  }
  const text = await response.text();
  const json = (response.headers.get("Content-Type") || "").startsWith("application/json");
  const answer = text && json ? JSON.parse(text) : text || null;
  if (response.ok) return answer;
  const code = (answer && answer.code) || `HTTP_${response.status}`;
  const message = (answer && answer.message) || text || response.statusText;
  if (response.status === 401) {
    window.dispatchEvent(new CustomEvent("weir:unauthorized", { detail: message }));
    throw new Unauthorized(401, code, message);
  }
  throw new ApiError(response.status, code, message);
}

// Check `pair` ("key:secret") by reading the OpenAPI document with it; keep
// it when the node takes it. Unauthorized when it does not.
export async function login(pair) {
  const doc = await call("GET", "/openapi.json", { pair });
  sessionStorage.setItem(STORE, pair);
  declared = new Set();
  for (const [path, operations] of Object.entries(doc.paths || {})) {
    for (const method of Object.keys(operations)) declared.add(`${method.toUpperCase()} ${path}`);
  }
}

// Does this node's API declare `method path` (path under /api/v5, with
// OpenAPI's {name} segments)?
export function has(method, path) {
  return declared !== null && declared.has(`${method} /${BASE}${path}`);
}

// A path segment: client ids, topics and CIDRs may hold "/" (URL-encoded, as EMQX asks).
export const seg = encodeURIComponent;
