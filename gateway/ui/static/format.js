// Small DOM and formatting helpers shared by the views: elements built without innerHTML (no markup is
// ever parsed from data), times in the viewer's zone with a relative age, and task statuses shown as
// word plus glyph (never colour alone).

export function el(tag, attributes = {}, children = []) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === false || value == null) continue;
    node.setAttribute(name, value === true ? "" : String(value));
  }
  node.append(...(Array.isArray(children) ? children : [children]));
  return node;
}

const clock = new Intl.DateTimeFormat(undefined, {
  hour: "2-digit",
  minute: "2-digit",
  second: "2-digit",
  fractionalSecondDigits: 3,
  hour12: false,
});
const day = new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric" });
const numbers = new Intl.NumberFormat("en-US");

/** The local time of day (with the date when it is not today). */
export function formatTime(when) {
  const today = new Date().toDateString() === when.toDateString();
  return today ? clock.format(when) : `${day.format(when)} ${clock.format(when)}`;
}

/** How long ago, coarsely: "now", "12 s ago", "3 min ago", "2 h ago", "4 d ago". */
export function relative(when, now = Date.now()) {
  return `${age(now - when.getTime())} ago`.replace(/^now ago$/, "now");
}

/** A duration in the largest whole unit. */
export function age(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 1) return "now";
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h`;
  return `${Math.floor(s / 86400)} d`;
}

/** 1234 -> "1,234" (the notices say "resumed after 1,234" whatever the viewer's locale). */
export function count(n) {
  return numbers.format(n);
}

export const TERMINAL = new Set(["completed", "failed", "cancelled"]);

/** A status badge: the word as its text, a glyph before it (app.css, by `data-status`), and colour as a
 * third cue only. The text stays the bare word, so it reads and copies as the protocol's status. */
export function statusBadge(status) {
  const word = String(status ?? "unknown");
  return el("span", { class: "badge", "data-status": word }, word);
}
