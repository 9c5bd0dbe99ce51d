// The task view: the live timeline (tasks/stream, resumed after the last seq on a drop or a reload),
// progress, status, the outcome, cancel, and the answer form of an input_required task, in the era the
// task asks in. It owns the view's connections and closes them when the view closes.
//
// It reads the task with 2026-07-28 requests (tasks/get, tasks/stream, tasks/cancel): they stand alone,
// so the view opens at once. A 2025-11-25 session is opened only for what needs one: a 2025-11-25 task's
// questions, which arrive on a tasks/result in a session (on a stdio upstream a session starts a process
// of its own, which can take seconds).

import { count, el, formatTime, relative, statusBadge, TERMINAL } from "./format.js";
import { renderForm, readForm } from "./form.js";
import { EventWindow, MAX_HELD, TimelineList, shortType } from "./timeline.js";
import { AuthNeeded, Dropped, LEGACY, MODERN, RpcError } from "./wire.js";

const LOAD_WINDOW = 400; // events read per scroll-load: many screens of rows, yet little work at a time
const LOAD_MARGIN = 100; // read this many before the first missing row, so scrolling up finds them held
const SAVE_MS = 200; // how often the resume cursor is written to sessionStorage
const RETRY_MS = [200, 400, 800, 1600, 3200, 5000];

const $ = (id) => document.getElementById(id);

export class TaskView {
  constructor(ctx, taskId) {
    this.ctx = ctx; // {wire, endpoint, authNeeded, notice}
    this.taskId = taskId;
    this.state = "loading";
    this.closed = false;
    this.controllers = new Set();
    this.window = new EventWindow();
    this.liveSeq = null; // the last seq the live stream processed: the resume cursor
    this.status = null;
    this.era = null;
    this.pendingInput = null;
    this.watching = false;
    this.loading = false;
    this.saveTimer = 0;
    this.cursorKey = `mcpTaskUi.after:${ctx.endpoint}:${taskId}`;
    this.section = $("task-view");
    this.list = new TimelineList($("timeline"), this.window, (from, to) => this.loadRange(from, to));
    this.ticker = setInterval(() => this.list.tick(), 1000);
    this.onCancel = () => this.cancel();
    this.onSubmit = (event) => {
      event.preventDefault();
      this.answer("accept");
    };
    this.onDecline = () => this.answer("decline");
    this.onEarliest = () => this.fromEarliest();
    this.onCopy = () => this.copyLink();
    ctx.wire.onServerRequest = (request) => this.serverRequest(request);
  }

  // -- lifecycle -----------------------------------------------------------------------------------

  async open() {
    this.section.hidden = false;
    this.section.dataset.taskId = this.taskId;
    $("task-body").hidden = false;
    $("not-found").hidden = true;
    $("task-id").textContent = this.taskId;
    $("task-outcome").hidden = true;
    $("input-form").hidden = true;
    $("events-gone").hidden = true;
    $("task-progress").value = 0;
    $("task-progress").removeAttribute("value"); // indeterminate until the first progress event
    $("progress-message").textContent = "";
    $("share-link").value = location.href;
    $("cancel-task").addEventListener("click", this.onCancel);
    $("input-form").addEventListener("submit", this.onSubmit);
    $("input-decline").addEventListener("click", this.onDecline);
    $("load-from-earliest").addEventListener("click", this.onEarliest);
    $("copy-link").addEventListener("click", this.onCopy);
    let task;
    try {
      task = await this.ctx.wire.modern("tasks/get", { taskId: this.taskId });
    } catch (error) {
      return this.failed(error);
    }
    if (this.closed) return;
    const created = new Date(task.createdAt);
    $("task-created").replaceChildren(
      Number.isNaN(created.getTime()) ? "—" : `${formatTime(created)} (${relative(created)})`,
    );
    this.setStatus(task.status, task.statusMessage);
    const stored = sessionStorage.getItem(this.cursorKey);
    this.follow(stored === null ? null : Number(stored));
  }

  close() {
    this.closed = true;
    this.saveCursor();
    clearInterval(this.ticker);
    clearTimeout(this.saveTimer);
    this.controllers.forEach((controller) => controller.abort());
    this.ctx.wire.onServerRequest = null;
    $("cancel-task").removeEventListener("click", this.onCancel);
    $("input-form").removeEventListener("submit", this.onSubmit);
    $("input-decline").removeEventListener("click", this.onDecline);
    $("load-from-earliest").removeEventListener("click", this.onEarliest);
    $("copy-link").removeEventListener("click", this.onCopy);
    this.section.hidden = true;
    $("timeline").replaceChildren();
  }

  controller() {
    const controller = new AbortController();
    this.controllers.add(controller);
    return controller;
  }

  failed(error) {
    if (this.closed || error?.name === "AbortError") return;
    if (error instanceof AuthNeeded) return this.ctx.authNeeded();
    if (error instanceof RpcError && error.code === -32602) {
      // An unknown task and another caller's task get the same answer from the gateway, and the same page.
      $("task-body").hidden = true;
      $("not-found").hidden = false;
      this.state = "ended";
      return;
    }
    this.ctx.notice(String(error.message));
  }

  // -- the live stream -----------------------------------------------------------------------------

  /** Follow the task's events to its end, reconnecting after `liveSeq` when the stream drops. */
  async follow(after) {
    let attempt = 0;
    if (after !== null) {
      // A reload (or "load from the earliest"): the events up to `after` exist, and are read when on screen.
      this.liveSeq = after;
      this.list.head = Math.max(this.list.head, after);
      this.ctx.notice(`resumed after ${count(after)}`);
    }
    while (!this.closed) {
      const controller = this.controller();
      const fromStart = after === null;
      let first = true;
      this.state = "live";
      try {
        await this.ctx.wire.stream(
          this.taskId,
          after,
          (event) => {
            if (fromStart && first) this.list.earliest = event.seq; // the earliest retained event
            first = false;
            attempt = 0;
            after = event.seq;
            this.live(event);
          },
          { era: MODERN, signal: controller.signal },
        );
        const task = await this.ctx.wire.modern("tasks/get", { taskId: this.taskId });
        this.setStatus(task.status, task.statusMessage);
        if (TERMINAL.has(task.status)) {
          this.outcome(task);
          this.state = "ended";
          this.saveCursor();
          return;
        }
      } catch (error) {
        if (this.closed || error.name === "AbortError") return;
        if (error instanceof RpcError && error.eventsGone) return this.gone(error.data.earliestSeq, after);
        if (!(error instanceof Dropped)) return this.failed(error);
      } finally {
        this.controllers.delete(controller);
      }
      // Dropped: wait, then resume after the last seq.
      await sleep(RETRY_MS[Math.min(attempt++, RETRY_MS.length - 1)]);
      this.state = "loading";
      this.ctx.notice(after === null ? "reconnecting…" : `resumed after ${count(after)}`);
    }
  }

  /** One event from the live stream. */
  live(event) {
    this.liveSeq = event.seq;
    this.list.head = Math.max(this.list.head, event.seq);
    if (this.list.follow) {
      // Following the end: the window slides with it (a gap, after a jump elsewhere, starts it afresh).
      if (!this.window.append(event)) this.window.events = [event];
      this.window.trim(event.seq, MAX_HELD / 10);
    } else if (this.window.last === event.seq - 1 && this.window.events.length < MAX_HELD) {
      this.window.append(event); // looking elsewhere: held only while it extends the window in memory
    }
    this.notable(event);
    this.list.schedule();
    if (!this.saveTimer) this.saveTimer = setTimeout(() => this.saveCursor(), SAVE_MS);
  }

  saveCursor() {
    this.saveTimer = 0;
    if (this.liveSeq !== null) sessionStorage.setItem(this.cursorKey, String(this.liveSeq));
  }

  /** What an event changes besides the timeline: tool, era, progress, status. */
  notable(event) {
    const kind = shortType(String(event.type ?? ""));
    const payload = event.payload ?? {};
    if (kind === "task.created") {
      this.era = payload.era ?? null;
      $("task-tool").textContent = String(payload.tool ?? "—");
    } else if (kind === "progress") {
      this.progress(payload);
    } else if (kind === "task.status") {
      this.setStatus(payload.status, payload.statusMessage);
    }
  }

  /** Show the latest progress once per frame: a replay of thousands of progress events draws it once. */
  progress(payload) {
    if (typeof payload.progress !== "number") return;
    const pending = this.latestProgress;
    this.latestProgress = payload;
    if (!pending) requestAnimationFrame(() => this.drawProgress());
  }

  drawProgress() {
    const payload = this.latestProgress;
    this.latestProgress = null;
    if (!payload || this.closed) return;
    const bar = $("task-progress");
    if (typeof payload.total === "number" && payload.total > 0) {
      bar.max = payload.total;
      bar.value = Math.min(payload.progress, payload.total);
    } else {
      bar.removeAttribute("value"); // no total: indeterminate
    }
    const head = payload.total != null ? `${payload.progress}/${payload.total}` : `${payload.progress}`;
    $("progress-message").textContent = payload.message ? `${head} · ${payload.message}` : head;
  }

  setStatus(status, message) {
    if (!status) return;
    const changed = status !== this.status;
    this.status = status;
    $("task-status").replaceChildren(statusBadge(status));
    $("status-message").textContent = message ?? "";
    $("cancel-task").disabled = TERMINAL.has(status);
    if (changed && status === "input_required") {
      if (this.era !== LEGACY) this.askModern();
      if (this.era !== MODERN) this.watchResult();
    }
    if (changed && status !== "input_required" && this.pendingInput) this.hideForm();
    if (TERMINAL.has(status) && this.list.head >= 0 && this.state !== "gone") this.list.schedule();
  }

  // -- events_gone ---------------------------------------------------------------------------------

  gone(earliest, after) {
    this.state = "gone";
    this.earliestRetained = earliest;
    $("events-gone").hidden = false;
    const lost = after === null ? "its earliest events" : `the events after seq ${count(after)}`;
    $("events-gone-text").textContent =
      `events_gone: the gateway no longer retains ${lost}. The earliest retained event is seq ${count(earliest)}.`;
    this.ctx.notice(`events_gone: earliest retained seq is ${count(earliest)}`);
  }

  fromEarliest() {
    const earliest = this.earliestRetained ?? 0;
    $("events-gone").hidden = true;
    this.window.events = [];
    this.list.earliest = earliest;
    this.list.head = Math.max(this.list.head, earliest - 1);
    this.list.follow = true;
    this.list.reset();
    this.ctx.notice(`loading from seq ${count(earliest)}, the earliest retained`);
    this.follow(null); // from the earliest retained event, wherever retention has moved it by now
  }

  // -- older (or skipped) events, read when scrolled to ---------------------------------------------

  /**
   * Read the held-nowhere rows `from`..`to` (on screen) with a tasks/stream of their own. A load whose
   * rows have left the screen meanwhile (a fling, or Home's animated scroll passing by) is dropped, and
   * the next frame asks for what is on screen then.
   */
  async loadRange(from, to) {
    if (this.closed) return;
    if (this.loading) {
      const [loadingFrom, loadingTo] = this.loadingRange;
      if (to < loadingFrom - LOAD_MARGIN || from > loadingTo) this.loadingController.abort();
      return;
    }
    this.loading = true;
    const start = Math.max(this.list.earliest, from - LOAD_MARGIN);
    const first = this.window.first;
    // No further than the held window when the rows are just before it, so the two join into one.
    const want = first !== null && start < first && to < first ? Math.min(LOAD_WINDOW, first - start) : LOAD_WINDOW;
    const after = start === 0 ? null : start - 1;
    const run = [];
    const controller = this.controller();
    this.loadingController = controller;
    this.loadingRange = [start, start + want - 1];
    let complete = true;
    try {
      // A 2026-07-28 stream is one POST of its own: it runs beside the session's live stream of this task.
      await this.ctx.wire.stream(
        this.taskId,
        after,
        (event) => {
          run.push(event);
          if (run.length >= want || (this.liveSeq !== null && event.seq >= this.liveSeq)) {
            complete = false; // enough: the abort that follows is ours, not a move
            controller.abort();
          }
        },
        { era: MODERN, signal: controller.signal },
      );
    } catch (error) {
      if (error instanceof RpcError && error.eventsGone) {
        this.list.earliest = error.data.earliestSeq; // retention moved on: those rows are gone for good
      } else if (error.name === "AbortError" && complete) {
        run.length = 0; // dropped: its rows left the screen
      } else if (error.name !== "AbortError") {
        this.ctx.notice(`cannot load events: ${error.message}`);
      }
    } finally {
      this.controllers.delete(controller);
    }
    if (this.closed) return;
    if (after === null && run.length) this.list.earliest = run[0].seq;
    this.window.merge(run);
    const [top, bottom] = this.list.visibleRange();
    this.window.trim((top + bottom) / 2);
    for (const event of run) if (shortType(String(event.type)) === "progress") this.progress(event.payload ?? {});
    this.loading = false;
    this.list.schedule();
  }

  // -- input and outcome ---------------------------------------------------------------------------

  /**
   * 2025-11-25: a tasks/result in the page's session while the task waits for input. The gateway carries
   * the task's server requests (elicitation/create) on it, which `serverRequest` answers; it returns once
   * the task ends (the outcome is read with tasks/get).
   */
  async watchResult() {
    if (this.watching) return;
    this.watching = true;
    let attempt = 0;
    while (!this.closed && !TERMINAL.has(this.status)) {
      const controller = this.controller();
      try {
        await this.ctx.wire.request("tasks/result", { taskId: this.taskId }, { signal: controller.signal });
        break;
      } catch (error) {
        if (this.closed || error.name === "AbortError") break;
        if (error instanceof AuthNeeded) return this.ctx.authNeeded();
        if (error instanceof RpcError) break; // the task ended in an error: tasks/get tells which
      } finally {
        this.controllers.delete(controller);
      }
      await sleep(RETRY_MS[Math.min(attempt++, RETRY_MS.length - 1)]);
    }
    this.watching = false;
  }

  /** The outcome of an ended task, from a 2026-07-28 tasks/get (which inlines it). */
  outcome(task) {
    const box = $("task-outcome");
    const result = task.result;
    const error = task.error;
    box.hidden = false;
    box.dataset.kind = error ? "error" : result?.isError ? "tool-error" : result ? "result" : task.status;
    const title = error ? "Error" : result?.isError ? "Result (tool error)" : result ? "Result" : `Task ${task.status}`;
    const parts = [el("h2", {}, title)];
    if (error) parts.push(el("p", { class: "error" }, `${error.code}: ${error.message}`));
    if (!error && !result && task.statusMessage) parts.push(el("p", {}, String(task.statusMessage)));
    for (const block of result?.content ?? []) {
      if (block.type === "text") parts.push(el("pre", { class: "content-text" }, String(block.text)));
      else parts.push(el("pre", { class: "content-other" }, JSON.stringify(block, null, 2)));
    }
    if (result && "structuredContent" in result) {
      parts.push(el("h3", {}, "Structured content"));
      parts.push(el("pre", { class: "structured" }, JSON.stringify(result.structuredContent, null, 2)));
    }
    box.replaceChildren(...parts);
    $("cancel-task").disabled = true;
  }

  /** A 2025-11-25 server request on our tasks/result: show its form, or refuse what a page cannot answer. */
  serverRequest(request) {
    const related = request.params?._meta?.["io.modelcontextprotocol/related-task"]?.taskId;
    if (request.method !== "elicitation/create" || (related && related !== this.taskId)) {
      const error = { code: -32601, message: `this page cannot answer ${request.method}` };
      this.ctx.wire.respond(request.id, null, error).catch((e) => this.ctx.notice(e.message));
      return;
    }
    this.showForm({ era: "legacy", id: request.id }, request.params ?? {});
  }

  /** 2026-07-28: the task's outstanding `inputRequests`, from a 2026-07-28 tasks/get. */
  async askModern() {
    if (this.era && this.era !== MODERN) return; // a 2025-11-25 task asks on tasks/result
    try {
      const task = await this.ctx.wire.modern("tasks/get", { taskId: this.taskId });
      const entries = Object.entries(task.inputRequests ?? {});
      const [key, request] = entries.find(([, each]) => each?.method === "elicitation/create") ?? [];
      if (key && !this.closed) this.showForm({ era: "modern", key }, request.params ?? {});
    } catch (error) {
      this.failed(error);
    }
  }

  showForm(target, params) {
    this.pendingInput = { target, params };
    $("input-message").textContent = String(params.message ?? "The task asks for input.");
    renderForm($("input-fields"), params.requestedSchema ?? {});
    $("input-form").hidden = false;
    $("input-form").querySelector("input, select, textarea, button")?.focus();
  }

  hideForm() {
    this.pendingInput = null;
    $("input-form").hidden = true;
  }

  async answer(action) {
    const pending = this.pendingInput;
    if (!pending) return;
    const form = $("input-form");
    if (action === "accept" && !form.reportValidity()) return;
    const answer = action === "accept" ? { action, content: readForm(form, pending.params.requestedSchema ?? {}) } : { action };
    this.hideForm();
    try {
      if (pending.target.era === "legacy") {
        await this.ctx.wire.respond(pending.target.id, answer);
      } else {
        const inputResponses = { [pending.target.key]: answer };
        await this.ctx.wire.modern("tasks/update", { taskId: this.taskId, inputResponses });
      }
      this.ctx.notice(action === "accept" ? "answer sent" : "declined");
    } catch (error) {
      this.ctx.notice(`the answer was not taken: ${error.message}`);
    }
  }

  async cancel() {
    $("cancel-task").disabled = true;
    try {
      const task = await this.ctx.wire.modern("tasks/cancel", { taskId: this.taskId });
      this.setStatus(task.status, task.statusMessage);
    } catch (error) {
      if (error instanceof AuthNeeded) return this.ctx.authNeeded();
      this.ctx.notice(`cancel refused: ${error.message}`);
      $("cancel-task").disabled = TERMINAL.has(this.status);
    }
  }

  /** Copy the task's link; where the clipboard is not offered (plain HTTP beyond loopback), select it. */
  async copyLink() {
    const input = $("share-link");
    const button = $("copy-link");
    try {
      await navigator.clipboard.writeText(input.value);
      button.textContent = "Copied";
      setTimeout(() => (button.textContent = "Copy"), 1500);
    } catch {
      input.select();
    }
  }

  /** The test hook's view of this task (read only). */
  hook() {
    return {
      events: () => this.window.events.map(({ seq, type }) => ({ seq, type })),
      lastSeq: () => this.liveSeq,
      heldCount: () => this.window.events.length,
      // Still reading rows on screen (after a reload, say) counts as loading, even once the task ended.
      state: () => (this.loading ? "loading" : this.state),
    };
  }
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
