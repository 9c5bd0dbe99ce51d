// The page's entry: reads /ui/config.json (which endpoint, which auth mode), asks for a token when the
// gateway wants one, routes by the URL hash (#/ the list, #/task/ID a task: the shareable late-join
// link) and exposes the read-only test hook `window.mcpTaskUi`.

import { ListView } from "./list.js";
import { TaskView } from "./task.js";
import { AuthNeeded, Wire } from "./wire.js";

const TOKEN_KEY = "mcpTaskGatewayToken";
const $ = (id) => document.getElementById(id);

const ctx = {
  config: null,
  wire: null,
  endpoint: "",
  aggregate: false,
  notice(text) {
    $("stream-notice").textContent = text;
  },
  authNeeded,
};
let view = null; // the open TaskView, or null on the list
let list = null;

// Read only: for the browser tests and for debugging in the console.
window.mcpTaskUi = {
  events: () => view?.hook().events() ?? [],
  lastSeq: () => view?.hook().lastSeq() ?? null,
  heldCount: () => view?.hook().heldCount() ?? 0,
  state: () => view?.hook().state() ?? "loading",
};

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

/** Show the token prompt: no token yet, or the gateway refused the one we have (401). */
function authNeeded(message) {
  if (token()) {
    sessionStorage.removeItem(TOKEN_KEY);
    message ??= "The gateway refused that token.";
  }
  closeViews();
  $("auth-form").hidden = false;
  $("auth-error").hidden = !message;
  $("auth-error").textContent = message ?? "";
  $("auth-token").focus();
}

function closeViews() {
  view?.close();
  view = null;
  list?.hide();
}

/** The endpoint the page talks to: `?endpoint=` when config.json lists it, else the default. */
function chooseEndpoint(config) {
  const asked = new URLSearchParams(location.search).get("endpoint");
  const known = config.endpoints.map((endpoint) => endpoint.path);
  return asked && known.includes(asked) ? asked : config.endpoint;
}

function endpointPicker(config) {
  if (config.endpoints.length < 2) return;
  const select = $("endpoint-select");
  select.replaceChildren(
    ...config.endpoints.map((endpoint) => {
      const option = document.createElement("option");
      option.value = endpoint.path;
      option.textContent = `${endpoint.name} (${endpoint.path})`;
      option.selected = endpoint.path === ctx.endpoint;
      return option;
    }),
  );
  select.addEventListener("change", () => {
    const url = new URL(location.href);
    if (select.value === config.endpoint) url.searchParams.delete("endpoint");
    else url.searchParams.set("endpoint", select.value);
    url.hash = "#/";
    location.assign(url); // a new page: the session and views start afresh on the chosen endpoint
  });
  $("endpoint-picker").hidden = false;
}

function route() {
  if (ctx.config.auth !== "none" && !token()) return authNeeded();
  $("auth-form").hidden = true;
  $("sign-out").hidden = ctx.config.auth === "none";
  closeViews();
  ctx.notice("");
  const match = /^#\/task\/(.+)$/.exec(location.hash);
  if (match) {
    const taskId = decodeURIComponent(match[1]);
    document.title = `Task ${taskId} · mcp-task-gateway`;
    view = new TaskView(ctx, taskId);
    view.open();
  } else {
    document.title = "Tasks · mcp-task-gateway";
    list.show();
  }
}

async function start() {
  try {
    const response = await fetch("/ui/config.json", { cache: "no-store", credentials: "omit" });
    ctx.config = await response.json();
  } catch (error) {
    ctx.notice(`cannot read /ui/config.json: ${error.message}`);
    return;
  }
  ctx.endpoint = chooseEndpoint(ctx.config);
  ctx.aggregate = ctx.config.endpoints.length > 1 && ctx.endpoint === ctx.config.endpoint;
  ctx.wire = new Wire(ctx.endpoint, token);
  list = new ListView(ctx);
  endpointPicker(ctx.config);
  $("footer").textContent = `mcp-task-gateway ${ctx.config.version} · endpoint ${ctx.endpoint}`;

  $("auth-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("auth-token").value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    $("auth-token").value = "";
    ctx.wire.sessionId = null; // a session belongs to its principal: the new token opens its own
    route();
  });
  $("sign-out").addEventListener("click", () => {
    ctx.wire.close();
    sessionStorage.removeItem(TOKEN_KEY);
    authNeeded();
  });
  window.addEventListener("hashchange", route);
  window.addEventListener("pagehide", () => {
    view?.saveCursor();
    ctx.wire.close();
  });
  window.addEventListener("unhandledrejection", (event) => {
    if (event.reason instanceof AuthNeeded) authNeeded();
  });
  route();
}

start();
