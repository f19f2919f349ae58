// Uploads on the collection page: many files or whole folders, one request per file (so each has a
// progress bar), then each item followed through the ingest queue until it is ready or failed.
import { csrfToken, errorText } from "./common.js";

const zone = document.getElementById("dropzone");
const ACCEPTED = /\.(jpe?g|png|webp|gif|bmp|tiff?|txt|md)$/i;
const PARALLEL = 3; // uploads at a time: enough to keep the queue fed, gentle on the server
const POLL_MS = 700;
const MAX_IDS = 400; // per status request
const MAX_ODD_ANSWERS = 5; // answers in a row that are not a status (an error, a page) before polling stops

if (zone) {
  const list = document.getElementById("uploads");
  const summary = document.getElementById("upload-summary");
  const waiting = [];
  const pending = new Map(); // item id -> rows (the same file dropped twice is one item)
  const rows = [];
  let active = 0;
  let timer = null;
  let oddAnswers = 0;

  const setState = (row, state, reason) => {
    row.state = state;
    row.stateEl.textContent = state;
    row.stateEl.className = `state ${state}`;
    row.el.dataset.state = state;
    if (reason) {
      row.reasonEl.textContent = reason;
      row.reasonEl.hidden = false;
    }
    const counts = {};
    for (const r of rows) counts[r.state] = (counts[r.state] || 0) + 1;
    summary.hidden = false;
    summary.textContent = Object.entries(counts)
      .map(([s, n]) => `${n} ${s}`)
      .join(" · ");
  };

  const addRow = (file, path) => {
    const el = document.createElement("li");
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = path || file.name; // file names are text, never markup
    name.title = name.textContent;
    const bar = document.createElement("progress");
    bar.max = 1;
    bar.value = 0;
    const stateEl = document.createElement("span");
    const reasonEl = document.createElement("span");
    reasonEl.className = "reason";
    reasonEl.hidden = true;
    el.append(name, bar, stateEl, reasonEl);
    list.append(el);
    const row = { file, path, el, bar, stateEl, reasonEl, state: "" };
    rows.push(row);
    return row;
  };

  // Polling ends for good (the rows say why): the answer would be the same at every tick.
  const stopPolling = (reason) => {
    for (const found of pending.values()) {
      for (const row of found) setState(row, "stopped", reason);
    }
    pending.clear();
  };

  const poll = () => {
    if (timer || pending.size === 0) return;
    timer = setTimeout(async () => {
      timer = null;
      const ids = [...pending.keys()].slice(0, MAX_IDS);
      let response;
      try {
        response = await fetch(`${zone.dataset.status}?ids=${ids.join(",")}`, {
          credentials: "same-origin",
          headers: { Accept: "application/json" }, // no session: a 401, not the sign-in page
        });
      } catch {
        poll(); // the server did not answer: retried at the next tick
        return;
      }
      if (response.status === 401) {
        stopPolling("session ended: sign in again");
        return;
      }
      if (response.status === 403) {
        const type = response.headers.get("content-type") || "";
        const text = await response.text().catch(() => "");
        stopPolling(errorText(text, type, "refused: sign in again"));
        return;
      }
      let body = null;
      if (response.ok) {
        try {
          body = await response.json();
        } catch {
          body = null; // a page, not the status: counted below
        }
      }
      if (typeof body?.items !== "object" || body.items === null) {
        oddAnswers += 1;
        if (oddAnswers >= MAX_ODD_ANSWERS) {
          stopPolling(`no status from the server (${response.status}): reload the page to see where they stand`);
        } else {
          poll();
        }
        return;
      }
      oddAnswers = 0;
      for (const id of ids) {
        const found = body.items?.[String(id)];
        const state = found ? found.status : "failed";
        if (state === "pending") continue;
        for (const row of pending.get(id)) {
          row.bar.value = 1;
          setState(row, state, found ? found.error : "the item was deleted");
        }
        pending.delete(id);
      }
      poll();
    }, POLL_MS);
  };

  const settle = (row, xhr) => {
    const type = xhr.getResponseHeader("content-type") || "";
    if (xhr.status < 200 || xhr.status >= 300) {
      setState(row, "refused", errorText(xhr.responseText, type, `refused (${xhr.status})`));
      return;
    }
    const body = JSON.parse(xhr.responseText);
    row.bar.value = 1;
    if (body.status === "pending") {
      setState(row, "pending");
      pending.set(body.id, [...(pending.get(body.id) || []), row]);
      poll();
    } else {
      setState(row, body.status);
    }
  };

  const send = (row) => {
    active += 1;
    setState(row, "uploading");
    const xhr = new XMLHttpRequest();
    xhr.open("POST", zone.dataset.upload);
    xhr.setRequestHeader("X-CSRF-Token", csrfToken);
    xhr.upload.addEventListener("progress", (event) => {
      if (event.lengthComputable) row.bar.value = event.loaded / event.total;
    });
    const done = () => {
      active -= 1;
      pump();
    };
    xhr.addEventListener("load", () => {
      settle(row, xhr);
      done();
    });
    xhr.addEventListener("error", () => {
      setState(row, "refused", "the upload did not reach the server");
      done();
    });
    const body = new FormData();
    body.append("file", row.file, row.file.name);
    if (row.path) body.append("path", row.path);
    xhr.send(body);
  };

  const pump = () => {
    while (active < PARALLEL && waiting.length) send(waiting.shift());
  };

  const add = (files) => {
    for (const { file, path } of files) {
      const row = addRow(file, path);
      if (ACCEPTED.test(file.name) || file.type.startsWith("image/")) {
        setState(row, "queued");
        waiting.push(row);
      } else {
        setState(row, "skipped", "not an image or a .txt/.md text");
      }
    }
    pump();
  };

  // Folders dropped on the page arrive as entries to walk (readEntries answers in chunks).
  const walk = async (entry, prefix, out) => {
    if (entry.isFile) {
      const file = await new Promise((resolve, reject) => entry.file(resolve, reject));
      out.push({ file, path: prefix + file.name });
    } else if (entry.isDirectory) {
      const reader = entry.createReader();
      for (;;) {
        const chunk = await new Promise((resolve, reject) => reader.readEntries(resolve, reject));
        if (chunk.length === 0) break;
        for (const child of chunk) await walk(child, `${prefix}${entry.name}/`, out);
      }
    }
  };

  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("over");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", async (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    const entries = [...event.dataTransfer.items].map((i) => i.webkitGetAsEntry?.()).filter(Boolean);
    if (entries.length === 0) {
      add([...event.dataTransfer.files].map((file) => ({ file, path: "" })));
      return;
    }
    const found = [];
    for (const entry of entries) await walk(entry, "", found);
    add(found);
  });
  for (const id of ["upload-files", "upload-folder"]) {
    const input = document.getElementById(id);
    input.addEventListener("change", () => {
      add([...input.files].map((file) => ({ file, path: file.webkitRelativePath || "" })));
      input.value = "";
    });
  }
}
