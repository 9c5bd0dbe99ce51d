// The timeline of one task: a bounded window of its events in memory (`EventWindow`) and a virtual list
// that draws only the rows on screen (`TimelineList`). A task may have 100,000 events; the page holds at
// most MAX_HELD of them and re-reads the others with tasks/stream `after` when they are scrolled to.

import { el, formatTime, relative } from "./format.js";

export const MAX_HELD = 5000;
export const ROW_HEIGHT = 28; // px, fixed: a row's position is its seq times this, so nothing is measured
const MARGIN_ROWS = 10; // drawn above and below the visible rows, so a small scroll shows no blank
const DEFAULT_PREFIX = "io.github.mcp-task-gateway.";
const LIFECYCLE = [".task.created", ".task.status", ".task.terminal"];

/** A contiguous run of events by seq, at most MAX_HELD long. */
export class EventWindow {
  constructor() {
    this.events = [];
  }
  get first() {
    return this.events.length ? this.events[0].seq : null;
  }
  get last() {
    return this.events.length ? this.events[this.events.length - 1].seq : null;
  }
  get(seq) {
    const first = this.first;
    return first === null ? undefined : this.events[seq - first];
  }
  /** Append the next event in order; false if it is not the next one (it would leave a gap). */
  append(event) {
    if (this.last !== null && event.seq <= this.last) return true; // a replay: already held
    if (this.last !== null && event.seq !== this.last + 1) return false;
    this.events.push(event);
    return true;
  }
  /** Join a run of events read elsewhere: kept beside the held ones when the two touch, else instead. */
  merge(run) {
    if (!run.length) return;
    const lo = run[0].seq;
    const hi = run[run.length - 1].seq;
    if (this.first === null || hi < this.first - 1 || lo > this.last + 1) {
      this.events = run;
      return;
    }
    const before = run.filter((event) => event.seq < this.first);
    const after = run.filter((event) => event.seq > this.last);
    this.events = before.concat(this.events, after);
  }
  /**
   * Drop events beyond MAX_HELD, from the end farther from `focusSeq` (what the person looks at), and
   * `slack` more: a window sliding with a fast live tail is then cut once per `slack` events, not per event.
   */
  trim(focusSeq, slack = 0) {
    if (this.events.length <= MAX_HELD) return;
    const extra = this.events.length - MAX_HELD + slack;
    const middle = (this.first + this.last) / 2;
    const keep = this.events.length - extra;
    this.events = focusSeq >= middle ? this.events.slice(extra) : this.events.slice(0, keep);
  }
}

/** The type without its vendor prefix, as `tail` prints it (gateway/client/tail.py Timeline.short_type). */
export function shortType(type, prefixes = [DEFAULT_PREFIX]) {
  for (const suffix of LIFECYCLE) {
    if (type.endsWith(suffix)) {
      const prefix = type.slice(0, -suffix.length + 1);
      if (!prefixes.includes(prefix)) prefixes.push(prefix);
    }
  }
  for (const prefix of prefixes) {
    if (type.startsWith(prefix) && type.length > prefix.length) return type.slice(prefix.length);
  }
  return type;
}

function compact(value, width = 100) {
  const text = (typeof value === "string" ? value : JSON.stringify(value) ?? "").split(/\s+/).join(" ").trim();
  return text.length <= width ? text : text.slice(0, width - 1) + "…";
}

/** One line about an event, worded as `tail` words it (gateway/client/tail.py Timeline.summary). */
export function summary(kind, payload) {
  payload = payload && typeof payload === "object" ? payload : {};
  if (kind === "progress") {
    const head = payload.total != null ? `${payload.progress}/${payload.total}` : `${payload.progress}`;
    return payload.message ? `${head}  ${compact(payload.message)}` : head;
  }
  if (kind === "log") {
    const logger = payload.logger ? `${payload.logger}: ` : "";
    return `${payload.level ?? "?"} ${logger}${compact(payload.data)}`;
  }
  if (kind === "task.created") return `tool=${payload.tool} status=${payload.status}`;
  if (kind === "task.status") {
    return `-> ${payload.status}` + (payload.statusMessage ? `  (${compact(payload.statusMessage)})` : "");
  }
  if (kind === "task.terminal") {
    const parts = [String(payload.status)];
    if (payload.error && typeof payload.error === "object") {
      parts.push(`error ${payload.error.code}: ${compact(payload.error.message)}`);
    } else if (payload.isError) parts.push("isError");
    if (Array.isArray(payload.content) && payload.content.length) {
      parts.push(payload.content.map((block) => `${block.type} (${block.bytes} B)`).join(", "));
    }
    return parts.join("  ");
  }
  if (kind === "payload.omitted") {
    return `${shortType(String(payload.originalType ?? "?"))} payload omitted: ${payload.size} B > limit ${payload.limit} B`;
  }
  if (kind === "input.requested") return `${payload.method} asks${payload.message ? ": " + compact(payload.message) : ""}`;
  if (kind === "input.answered") return `${payload.method} answered${payload.action ? ": " + payload.action : ""}`;
  return compact(payload);
}

export function recordedAt(event) {
  const value = event._meta?.["io.github.mcp-task-gateway/recordedAt"];
  const when = typeof value === "string" ? new Date(value) : null;
  return when && !Number.isNaN(when.getTime()) ? when : null;
}

/**
 * The virtual list in `#timeline`: a spacer as tall as all the task's rows, and absolutely placed rows
 * for the visible seqs only. Rows not held show as placeholders, and `onMissing(from, to)` is told the
 * seq range on screen that is not held, so the view reads it.
 */
export class TimelineList {
  constructor(container, window, onMissing) {
    this.container = container;
    this.window = window;
    this.onMissing = onMissing;
    this.earliest = 0; // the first seq of the list (the earliest retained event)
    this.head = -1; // the highest seq known to exist
    this.spacer = el("div", { class: "timeline-spacer" });
    this.rows = el("div", { class: "timeline-rows", role: "list" });
    this.spacer.append(this.rows);
    container.replaceChildren(this.spacer);
    this.follow = true; // stuck to the bottom: new events scroll into view
    this.drawn = new Map(); // seq -> row element, reused while the seq stays on screen
    this.frame = 0;
    container.addEventListener("scroll", () => {
      this.follow = this.atBottom();
      this.schedule();
    });
  }
  atBottom() {
    const box = this.container;
    return box.scrollHeight - box.scrollTop - box.clientHeight < ROW_HEIGHT * 2;
  }
  /** Redraw on the next animation frame (many events in one tick draw once). */
  schedule() {
    if (!this.frame) this.frame = requestAnimationFrame(() => this.draw());
  }
  visibleRange() {
    const box = this.container;
    const top = Math.floor(box.scrollTop / ROW_HEIGHT) + this.earliest;
    const count = Math.ceil(box.clientHeight / ROW_HEIGHT);
    return [top, Math.min(this.head, top + count)];
  }
  draw() {
    this.frame = 0;
    const count = Math.max(0, this.head - this.earliest + 1);
    this.spacer.style.height = `${count * ROW_HEIGHT}px`;
    if (this.follow) this.container.scrollTop = this.container.scrollHeight;
    const [top, bottom] = this.visibleRange();
    const from = Math.max(this.earliest, top - MARGIN_ROWS);
    const to = Math.min(this.head, bottom + MARGIN_ROWS);
    const keep = new Map();
    let missingFrom = null;
    let missingTo = null;
    for (let seq = from; seq <= to; seq++) {
      const event = this.window.get(seq);
      if (!event && seq >= top && seq <= bottom) {
        missingFrom ??= seq;
        missingTo = seq;
      }
      let row = this.drawn.get(seq);
      if (!row || row.held !== Boolean(event)) row = event ? eventRow(event) : placeholderRow(seq);
      row.held = Boolean(event);
      row.style.top = `${(seq - this.earliest) * ROW_HEIGHT}px`;
      keep.set(seq, row);
    }
    for (const [seq, row] of this.drawn) if (!keep.has(seq)) row.remove();
    for (const row of keep.values()) if (!row.isConnected) this.rows.append(row);
    this.drawn = keep;
    if (missingFrom !== null) this.onMissing(missingFrom, missingTo);
  }
  /** Refresh the relative ages of the drawn rows (each second). */
  tick() {
    for (const row of this.drawn.values()) {
      const time = row.querySelector("time");
      if (time) time.textContent = `${formatTime(new Date(time.dateTime))} · ${relative(new Date(time.dateTime))}`;
    }
  }
  reset() {
    this.drawn.forEach((row) => row.remove());
    this.drawn = new Map();
    this.schedule();
  }
}

function eventRow(event) {
  const kind = shortType(String(event.type ?? "?"));
  const when = recordedAt(event);
  const classes = ["event", `kind-${kind.replace(/[^a-z0-9]+/gi, "-")}`];
  if (kind === "task.status" || kind === "task.terminal") classes.push("status-change");
  const payload = el("details", { class: "event-payload" }, [
    el("summary", { "aria-label": `payload of event ${event.seq}` }, "{…}"),
    el("pre", {}, JSON.stringify(event.payload ?? null, null, 2)),
  ]);
  // An open payload would not fit the fixed row: it opens as an overlay on top of the rows below.
  payload.addEventListener("toggle", () => payload.parentElement?.classList.toggle("open", payload.open));
  return el("div", { class: classes.join(" "), role: "listitem", "data-seq": event.seq, "data-type": event.type }, [
    el("span", { class: "event-seq" }, String(event.seq)),
    when
      ? el("time", { class: "event-time", datetime: when.toISOString() }, `${formatTime(when)} · ${relative(when)}`)
      : el("time", { class: "event-time" }, "—"),
    el("span", { class: "event-type" }, kind),
    el("span", { class: "event-summary", title: summary(kind, event.payload) }, summary(kind, event.payload)),
    payload,
  ]);
}

function placeholderRow(seq) {
  return el("div", { class: "placeholder", "aria-hidden": "true" }, [
    el("span", { class: "event-seq" }, String(seq)),
    el("span", { class: "loading" }, "loading…"),
  ]);
}
