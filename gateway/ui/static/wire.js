// The wire: JSON-RPC over Streamable HTTP to one MCP endpoint of this gateway, in the two eras the page
// uses, and SEP-2694 tasks/stream read from a streaming fetch body. It mirrors gateway/client/stream.py:
// a 2025-11-25 session (initialize, Mcp-Session-Id, renewed when the server forgets it, DELETE on exit),
// 2026-07-28 stateless requests (the `_meta` envelope, Mcp-Method/Mcp-Name headers), JSON or SSE replies.
// Credentials travel only in the Authorization header, never in a URL.

export const LEGACY = "2025-11-25";
export const MODERN = "2026-07-28";
export const TASK_EVENT = "notifications/tasks/event";
const SESSION_HEADER = "Mcp-Session-Id";
const YIELD_EVERY = 100; // events handled between two turns of the event loop while a stream catches up
// Which param names the request in the 2026-07-28 Mcp-Name header (gateway/protocol/envelope.py NAME_PARAM).
const NAME_PARAM = { "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId", "tasks/stream": "taskId" };

export class RpcError extends Error {
  constructor(code, message, data, status) {
    super(`${message} (JSON-RPC ${code})`);
    this.code = code;
    this.rpcMessage = message;
    this.data = data;
    this.status = status;
  }
  get eventsGone() {
    return this.data?.reason === "events_gone";
  }
}

/** The server wants credentials (401): the page asks for a token and tries again. */
export class AuthNeeded extends Error {}

/** The connection broke, or a response ended before its answer: worth retrying. */
export class Dropped extends Error {}

/** A sans-I/O SSE parser (the WHATWG rules the Python SseParser follows): feed text, get events. */
export class SseParser {
  constructor() {
    this.buffer = "";
    this.data = [];
    this.event = "";
  }
  /**
   * The events `text` completes, lazily: a chunk of megabytes is split only as far as its reader reads,
   * so a reader that stops (aborted) or pauses (to let the page answer input) costs no more than that.
   * Read each generator to its end, or drop the parser, before feeding it again.
   */
  *feed(text) {
    this.buffer += text;
    const newline = /\r\n|\r|\n/g;
    let start = 0;
    for (;;) {
      newline.lastIndex = start;
      const found = newline.exec(this.buffer);
      // A lone \r at the end may be the first half of \r\n: wait for the next chunk.
      if (!found || (found[0] === "\r" && found.index === this.buffer.length - 1)) break;
      const event = this.line(this.buffer.slice(start, found.index));
      start = found.index + found[0].length;
      if (event) yield event;
    }
    this.buffer = this.buffer.slice(start);
  }
  /** One line; the event it ends, if any. */
  line(line) {
    if (line === "") {
      const event = this.data.length ? { event: this.event || "message", data: this.data.join("\n") } : null;
      this.data = [];
      this.event = "";
      return event;
    }
    if (line.startsWith(":")) return null; // a keep-alive comment
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
    return null;
  }
}

/** The JSON-RPC messages of one fetch response, JSON or SSE, as they arrive. */
export async function* messagesOf(response) {
  const type = (response.headers.get("Content-Type") || "").split(";")[0].trim().toLowerCase();
  if (type === "application/json") {
    const message = await response.json();
    if (message && typeof message === "object") yield message;
    return;
  }
  if (type !== "text/event-stream") {
    throw new Dropped(`HTTP ${response.status} (${type || "no body"})`);
  }
  const parser = new SseParser();
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  try {
    for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (error) {
        if (error.name === "AbortError") throw error;
        throw new Dropped(`the connection dropped mid-response (${error.message})`);
      }
      if (chunk.done) return;
      for (const event of parser.feed(chunk.value)) {
        if (event.event !== "message" || !event.data) continue;
        yield JSON.parse(event.data);
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

function answers(message, id) {
  return !("method" in message) && (message.id === id || (message.id == null && "error" in message));
}

function errorOf(error, status) {
  return new RpcError(error?.code ?? -32603, String(error?.message ?? "error"), error?.data, status);
}

/** One MCP endpoint, spoken to in both eras with the caller's token. */
export class Wire {
  /**
   * @param {string} url the endpoint path (`/mcp`)
   * @param {() => string|null} token the caller's token, read at each request (it may change after a 401)
   */
  constructor(url, token) {
    this.url = url;
    this.token = token;
    this.ids = 1;
    this.sessionId = null;
    this.opening = null;
    // Answers a 2025-11-25 server request (elicitation/create...) that arrives on a response stream.
    this.onServerRequest = null;
  }

  nextId() {
    return this.ids++;
  }

  headers(message, era) {
    const headers = {
      "Content-Type": "application/json",
      Accept: "application/json, text/event-stream",
      "MCP-Protocol-Version": era,
    };
    const token = this.token();
    if (token) headers.Authorization = `Bearer ${token}`;
    if (era === LEGACY && this.sessionId) headers[SESSION_HEADER] = this.sessionId;
    if (era === MODERN && message.method && "id" in message) {
      headers["Mcp-Method"] = message.method;
      const name = NAME_PARAM[message.method];
      if (name && message.params && name in message.params) headers["Mcp-Name"] = String(message.params[name]);
    }
    return headers;
  }

  async send(message, era, signal) {
    let response;
    try {
      response = await fetch(this.url, {
        method: "POST",
        headers: this.headers(message, era),
        body: JSON.stringify(message),
        signal,
        cache: "no-store",
        credentials: "omit", // the token is the only credential, and it is sent explicitly
      });
    } catch (error) {
      if (error.name === "AbortError") throw error;
      throw new Dropped(`cannot reach ${this.url}: ${error.message}`);
    }
    if (response.status === 401) throw new AuthNeeded("the gateway wants a token");
    return response;
  }

  /** POST in the 2025-11-25 session, opening (or renewing, after a 404 for it) the session as needed. */
  async post(message, signal) {
    if (!this.sessionId) await this.open();
    const session = this.sessionId;
    let response = await this.send(message, LEGACY, signal);
    if (response.status === 404 && session) {
      // The server forgot the session (idle, restarted): it did nothing with the request, so send it again.
      await this.renew(session);
      response = await this.send(message, LEGACY, signal);
    }
    return response;
  }

  async open() {
    this.opening ??= this.initialize().finally(() => (this.opening = null));
    return this.opening;
  }

  async renew(stale) {
    if (this.sessionId === stale) this.sessionId = null;
    if (!this.sessionId) await this.open();
  }

  async initialize() {
    const message = {
      jsonrpc: "2.0",
      id: this.nextId(),
      method: "initialize",
      params: {
        protocolVersion: LEGACY,
        capabilities: { elicitation: { form: {} } },
        clientInfo: { name: "mcp-task-gateway-ui", version: "1" },
      },
    };
    const response = await this.send(message, LEGACY);
    const final = await this.final(response, message.id);
    if (final.error) throw errorOf(final.error, response.status);
    this.sessionId = response.headers.get(SESSION_HEADER);
    if (!this.sessionId) throw new Dropped("initialize answered without a session id");
    await this.notify({ jsonrpc: "2.0", method: "notifications/initialized" });
  }

  /** Read a response until the answer to `id`; answer server requests and pass notifications on. */
  async final(response, id, onMessage) {
    for await (const message of messagesOf(response)) {
      if (answers(message, id)) return message;
      if ("method" in message && "id" in message) await this.answerServerRequest(message);
      else if (onMessage && "method" in message) onMessage(message);
    }
    throw new Dropped(`the response ended before the answer to request ${id}`);
  }

  async answerServerRequest(request) {
    if (!this.onServerRequest) {
      await this.respond(request.id, null, { code: -32601, message: `Method not found: ${request.method}` });
      return;
    }
    this.onServerRequest(request); // answered later, when the person submits the form (`respond`)
  }

  /** A JSON-RPC response POST on the session that received the request (202). */
  async respond(id, result, error) {
    const message = error ? { jsonrpc: "2.0", id, error } : { jsonrpc: "2.0", id, result };
    await this.notify(message);
  }

  async notify(message) {
    const response = await this.send(message, LEGACY);
    if (response.status >= 400) {
      const final = await this.final(response, message.id ?? null).catch(() => ({}));
      throw errorOf(final.error ?? { code: -32603, message: `HTTP ${response.status}` }, response.status);
    }
    await response.body?.cancel();
  }

  /** A 2025-11-25 request in the session: its result (RpcError for an error answer). */
  async request(method, params, { signal, onMessage } = {}) {
    const message = { jsonrpc: "2.0", id: this.nextId(), method, params: params ?? {} };
    const response = await this.post(message, signal);
    const final = await this.final(response, message.id, onMessage);
    if (final.error) throw errorOf(final.error, response.status);
    return final.result ?? {};
  }

  /** A 2026-07-28 request: stateless, with the envelope the era requires. */
  async modern(method, params, { signal } = {}) {
    const message = { jsonrpc: "2.0", id: this.nextId(), method, params: envelope(params) };
    const response = await this.send(message, MODERN, signal);
    const final = await this.final(response, message.id);
    if (final.error) throw errorOf(final.error, response.status);
    return final.result ?? {};
  }

  /**
   * tasks/stream: each event (the notification's params) to `onEvent`, in order, until the final
   * result. `era` LEGACY streams in the session (one per task per session); MODERN is one POST of its
   * own, so any number may run beside the session's. Abort `signal` to stop early.
   */
  async stream(taskId, after, onEvent, { era = LEGACY, signal } = {}) {
    const params = { taskId };
    if (after != null) params.after = after;
    const message = {
      jsonrpc: "2.0",
      id: this.nextId(),
      method: "tasks/stream",
      params: era === MODERN ? envelope(params) : params,
    };
    const response = era === MODERN ? await this.send(message, MODERN, signal) : await this.post(message, signal);
    let sinceYield = 0;
    for await (const incoming of messagesOf(response)) {
      // One network chunk may hold thousands of events: stop at once when aborted (not after the chunk),
      // and give the page a turn every YIELD_EVERY events so keys and scrolls are answered meanwhile.
      signal?.throwIfAborted();
      if (++sinceYield >= YIELD_EVERY) {
        sinceYield = 0;
        await new Promise((resolve) => setTimeout(resolve, 0));
        signal?.throwIfAborted();
      }
      if (incoming.method === TASK_EVENT) {
        const event = incoming.params;
        if (event?.taskId === taskId && Number.isInteger(event.seq)) onEvent(event);
      } else if (answers(incoming, message.id)) {
        if (incoming.error) throw errorOf(incoming.error, response.status);
        return incoming.result ?? {};
      } else if ("method" in incoming && "id" in incoming) {
        await this.answerServerRequest(incoming);
      }
    }
    throw new Dropped(`the tasks/stream for task ${taskId} ended without a response`);
  }

  /** End the session when the page goes away (best effort; `keepalive` lets it outlive the page). */
  close() {
    if (!this.sessionId) return;
    const headers = { [SESSION_HEADER]: this.sessionId, "MCP-Protocol-Version": LEGACY };
    const token = this.token();
    if (token) headers.Authorization = `Bearer ${token}`;
    this.sessionId = null;
    fetch(this.url, { method: "DELETE", headers, keepalive: true, credentials: "omit" }).catch(() => {});
  }
}

function envelope(params) {
  return {
    ...params,
    _meta: {
      "io.modelcontextprotocol/protocolVersion": MODERN,
      "io.modelcontextprotocol/clientCapabilities": {
        extensions: { "io.modelcontextprotocol/tasks": {} },
        elicitation: { form: {} },
      },
      ...(params?._meta ?? {}),
    },
  };
}
