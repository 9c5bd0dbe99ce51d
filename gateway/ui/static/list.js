// The task list: the caller's tasks from tasks/list (every page loaded so far, refreshed live), filtered
// by status in the page (tasks/list has no filter), rows updated in place so focus and selection stay.

import { age, el, formatTime, relative, statusBadge } from "./format.js";
import { AuthNeeded } from "./wire.js";

const REFRESH_MS = 400; // the contract asks for at most 500 ms between refreshes
const TOOL_KEY = "io.github.mcp-task-gateway/tool";
const UPSTREAM_KEY = "io.github.mcp-task-gateway/upstream";

export class ListView {
  constructor(ctx) {
    this.ctx = ctx; // {wire, aggregate, authNeeded, notice}
    this.section = document.getElementById("list-view");
    this.table = document.getElementById("task-list");
    this.filter = document.getElementById("status-filter");
    this.more = document.getElementById("list-more");
    this.empty = document.getElementById("list-empty");
    this.pages = 1;
    this.tasks = [];
    this.nextCursor = null;
    this.timer = 0;
    this.rows = new Map();
    const columns = ["Task", "Tool", ...(ctx.aggregate ? ["Upstream"] : []), "Status", "Created", "Last event", "Age"];
    this.table.tHead.rows[0].replaceChildren(...columns.map((name) => el("th", { scope: "col" }, name)));
    this.filter.addEventListener("change", () => this.render());
    this.more.addEventListener("click", () => {
      this.pages += 1;
      this.refresh();
    });
  }

  show() {
    this.shown = true;
    this.ctx.notice("connecting…");
    this.refresh();
  }

  hide() {
    this.shown = false;
    this.section.hidden = true;
    clearTimeout(this.timer);
    this.timer = 0;
  }

  /** Read every page shown so far (the first `pages` of tasks/list), then draw, then come back. */
  async refresh() {
    clearTimeout(this.timer);
    if (!this.shown) return;
    try {
      const tasks = [];
      let cursor = null;
      for (let page = 0; page < this.pages; page++) {
        const result = await this.ctx.wire.request("tasks/list", cursor ? { cursor } : {});
        tasks.push(...(result.tasks ?? []));
        cursor = typeof result.nextCursor === "string" && result.nextCursor ? result.nextCursor : null;
        if (!cursor) break;
      }
      if (!this.shown) return;
      this.tasks = tasks;
      this.nextCursor = cursor;
      this.render();
      if (this.section.hidden || this.failing) {
        // Shown once it has something true to show (the session's first answer can take seconds).
        this.section.hidden = false;
        this.failing = false;
        this.ctx.notice("");
      }
    } catch (error) {
      if (error instanceof AuthNeeded) return this.ctx.authNeeded();
      this.failing = true;
      this.ctx.notice(`cannot list tasks: ${error.message}; retrying`);
    }
    if (this.shown) this.timer = setTimeout(() => this.refresh(), REFRESH_MS);
  }

  render() {
    const wanted = this.filter.value;
    const shown = this.tasks
      .filter((task) => !wanted || task.status === wanted)
      .sort((a, b) => String(b.createdAt).localeCompare(String(a.createdAt)));
    const body = this.table.tBodies[0];
    const rows = new Map();
    shown.forEach((task, index) => {
      const row = this.rows.get(task.taskId) ?? el("tr", { "data-task-id": task.taskId });
      this.fill(row, task);
      rows.set(task.taskId, row);
      if (body.children[index] !== row) body.insertBefore(row, body.children[index] ?? null);
    });
    for (const [id, row] of this.rows) if (!rows.has(id)) row.remove();
    this.rows = rows;
    this.empty.hidden = shown.length > 0;
    this.empty.textContent = this.tasks.length ? "No task has this status." : "No tasks yet.";
    this.more.hidden = !this.nextCursor;
  }

  fill(row, task) {
    const meta = task._meta ?? {};
    const created = new Date(task.createdAt);
    const updated = new Date(task.lastUpdatedAt ?? task.createdAt);
    const key = JSON.stringify([task.status, task.lastUpdatedAt, meta[TOOL_KEY], meta[UPSTREAM_KEY]]);
    if (row.dataset.key === key) {
      // Unchanged: only the ages move. The cells stay, so a focused link keeps its focus.
      row.querySelector(".age").textContent = age(Date.now() - created.getTime());
      row.querySelectorAll(".relative").forEach((span, i) => (span.textContent = relative(i ? updated : created)));
      return;
    }
    row.dataset.key = key;
    row.dataset.status = task.status;
    const link = el("a", { href: `#/task/${encodeURIComponent(task.taskId)}` }, el("code", {}, task.taskId));
    const cells = [
      el("td", { class: "task-id" }, link),
      el("td", { class: "tool" }, String(meta[TOOL_KEY] ?? "—")),
      ...(this.ctx.aggregate ? [el("td", { class: "upstream" }, String(meta[UPSTREAM_KEY] ?? "—"))] : []),
      el("td", { class: "status" }, statusBadge(task.status)),
      timeCell("created", created),
      timeCell("last-event", updated),
      el("td", { class: "age" }, age(Date.now() - created.getTime())),
    ];
    row.replaceChildren(...cells);
  }
}

function timeCell(name, when) {
  if (Number.isNaN(when.getTime())) return el("td", { class: name }, "—");
  return el("td", { class: name }, [
    el("time", { datetime: when.toISOString(), title: when.toString() }, formatTime(when)),
    el("span", { class: "relative" }, relative(when)),
  ]);
}
