// ragserve console. Plain JS, no build step, no remote assets.
//
// Rule: nothing that comes from the server (document text, filenames, answers, error
// messages) is ever parsed as HTML. Everything is written with textContent or
// createTextNode; the page's Content-Security-Policy forbids inline script and remote images
// as a second line of defence.
import { drawChart, drawSeries } from "./chart.js";
import { append, clear, el } from "./dom.js";
import { kindOf, sseEvents, tokenText } from "./sse.js";

(function () {
  const KEY = "ragserve.apiKey";
  const POLL_MS = 1000;
  // Characters of the cited passage's surroundings shown on each side of the cited span.
  const CONTEXT_CHARS = 400;
  const STATUSES = ["queued", "parsing", "embedding", "indexed", "failed"];

  const $ = (id) => document.getElementById(id);

  // ------------------------------------------------------------------ small helpers

  function bytes(n) {
    if (n < 1024) return n + " B";
    if (n < 1024 * 1024) return (n / 1024).toFixed(1) + " KiB";
    return (n / 1024 / 1024).toFixed(1) + " MiB";
  }

  function when(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    return isNaN(d) ? "" : d.toLocaleString();
  }

  function banner(message, kind) {
    const b = $("banner");
    if (!message) {
      b.hidden = true;
      return;
    }
    b.textContent = message;
    b.className = "banner" + (kind ? " " + kind : "");
    b.hidden = false;
  }

  // ------------------------------------------------------------------ API

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  function apiKey() {
    return sessionStorage.getItem(KEY);
  }

  async function api(method, path, body) {
    const headers = { Authorization: "Bearer " + apiKey() };
    let payload;
    if (body instanceof FormData) payload = body;
    else if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      payload = JSON.stringify(body);
    }
    const r = await fetch(path, { method, headers, body: payload });
    if (r.status === 401) {
      signOut("Your API key was refused; sign in again.");
      throw new ApiError(401, "unauthorized");
    }
    if (r.status === 204) return null;
    const data = await r.json().catch(() => null);
    if (!r.ok) throw new ApiError(r.status, errorMessage(r, data));
    return data;
  }

  function errorMessage(r, data) {
    const e = data && data.error;
    let message = (e && e.message) || r.statusText || "request failed";
    const retry = r.headers.get("Retry-After");
    if (r.status === 429 && retry) message += " (retry in " + retry + " s)";
    return r.status + ": " + message;
  }

  // ------------------------------------------------------------------ routing

  // #/collections, #/c/<id>/documents, #/c/<id>/ask, #/c/<id>/tune
  const state = { view: null, collection: null, pollTimer: null, ask: null };

  function go(hash) {
    if (location.hash === hash) route();
    else location.hash = hash;
  }

  function showView(name) {
    for (const v of document.querySelectorAll(".view")) v.hidden = v.id !== "view-" + name;
    $("signout").hidden = name === "signin";
    state.view = name;
  }

  function stopPolling() {
    if (state.pollTimer) clearTimeout(state.pollTimer);
    state.pollTimer = null;
  }

  async function route() {
    stopPolling();
    banner(null);
    if (!apiKey()) return showSignIn();
    const parts = location.hash.replace(/^#\/?/, "").split("/");
    if (parts[0] === "c" && parts[1]) {
      return showCollection(decodeURIComponent(parts[1]), parts[2] || "documents");
    }
    return showCollections();
  }

  function crumbs(...items) {
    const nav = $("crumbs");
    clear(nav);
    items.forEach((item, i) => {
      if (i) append(nav, el("span", { text: "›" }));
      append(nav, item.href ? el("a", { href: item.href, text: item.text }) : el("span", { text: item.text }));
    });
  }

  // ------------------------------------------------------------------ sign in

  function showSignIn(message) {
    showView("signin");
    crumbs();
    if (message) banner(message);
    $("signin-key").focus();
  }

  function signOut(message) {
    sessionStorage.removeItem(KEY);
    stopPolling();
    if (state.ask) state.ask.abort();
    showSignIn(message);
    if (location.hash) history.replaceState(null, "", location.pathname);
  }

  $("signin-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = $("signin-key").value.trim();
    if (!key) return;
    sessionStorage.setItem(KEY, key);
    try {
      await api("GET", "/v1/collections");
    } catch (err) {
      if (err.status !== 401) {
        sessionStorage.removeItem(KEY);
        banner("Sign-in failed: " + err.message);
      }
      return;
    }
    $("signin-key").value = "";
    go(location.hash && location.hash !== "#/" ? location.hash : "#/collections");
  });

  $("signout").addEventListener("click", () => signOut());

  // ------------------------------------------------------------------ collections

  async function showCollections() {
    showView("collections");
    crumbs({ text: "Collections" });
    let data;
    try {
      data = await api("GET", "/v1/collections");
    } catch (err) {
      return banner(err.message);
    }
    const body = $("collections-body");
    clear(body);
    $("collections-empty").hidden = data.collections.length > 0;
    for (const c of data.collections) {
      const docs = Object.entries(c.documents || {})
        .map(([s, n]) => n + " " + s)
        .join(", ");
      const defaults = Object.entries(c.search_defaults || {})
        .map(([k, v]) => k + "=" + v)
        .join(", ");
      const params = Object.entries(c.index_params || {})
        .map(([k, v]) => k + "=" + v)
        .join(", ");
      body.appendChild(
        el(
          "tr",
          { "data-id": c.id },
          el(
            "td",
            {},
            el("a", { href: "#/c/" + encodeURIComponent(c.id) + "/documents", text: c.name }),
            el("div", { class: "muted", text: c.description || c.id })
          ),
          el("td", { text: c.index_kind + (params ? " (" + params + ")" : "") }),
          el("td", { text: docs || "0" }),
          el("td", { text: c.chunks }),
          el("td", { text: defaults || "—" }),
          el(
            "td",
            {},
            el("button", {
              class: "danger",
              type: "button",
              text: "Delete",
              onclick: () => deleteCollection(c),
            })
          )
        )
      );
    }
  }

  async function deleteCollection(c) {
    if (!confirm("Delete the collection “" + c.name + "” and all its documents?")) return;
    try {
      await api("DELETE", "/v1/collections/" + encodeURIComponent(c.id));
    } catch (err) {
      return banner(err.message);
    }
    showCollections();
  }

  function syncKnobs() {
    const kind = $("create-kind").value;
    for (const group of $("create-knobs").querySelectorAll("[data-kinds]")) {
      group.hidden = !group.dataset.kinds.split(" ").includes(kind);
    }
  }
  $("create-kind").addEventListener("change", syncKnobs);
  syncKnobs();

  function intOrNull(input) {
    return input.value.trim() === "" ? null : Number.parseInt(input.value, 10);
  }

  $("create-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const kind = $("create-kind").value;
    const params = {};
    for (const group of $("create-knobs").querySelectorAll("[data-kinds]")) {
      if (group.hidden) continue;
      for (const input of group.querySelectorAll("input")) {
        const v = intOrNull(input);
        if (v !== null) params[input.name] = v;
      }
    }
    const chunking = {};
    const tokens = intOrNull($("create-tokens"));
    const overlap = intOrNull($("create-overlap"));
    if (tokens !== null) chunking.tokens = tokens;
    if (overlap !== null) chunking.overlap = overlap;
    const body = {
      name: $("create-name").value,
      description: $("create-description").value,
      index: { kind, params },
      chunking,
    };
    let created;
    try {
      created = await api("POST", "/v1/collections", body);
    } catch (err) {
      return banner(err.message);
    }
    $("create-form").reset();
    syncKnobs();
    go("#/c/" + encodeURIComponent(created.id) + "/documents");
  });

  // ------------------------------------------------------------------ one collection

  async function showCollection(id, tab) {
    showView("collection");
    let c = state.collection;
    if (!c || c.id !== id) {
      try {
        c = await api("GET", "/v1/collections/" + encodeURIComponent(id));
      } catch (err) {
        return banner(err.message);
      }
      state.collection = c;
      resetAsk();
    }
    $("collection-title").textContent = c.name;
    $("collection-meta").textContent =
      c.index_kind + " index · " + c.embedding_model + " (" + c.embedding_dim + "d) · " +
      c.chunk_tokens + "-token chunks · id " + c.id;
    const base = "#/c/" + encodeURIComponent(id) + "/";
    for (const name of ["documents", "ask", "tune", "quality"]) {
      const a = $("tab-" + name);
      a.href = base + name;
      a.classList.toggle("active", name === tab);
      $("pane-" + name).hidden = name !== tab;
    }
    crumbs(
      { text: "Collections", href: "#/collections" },
      { text: c.name, href: base + "documents" },
      { text: tab[0].toUpperCase() + tab.slice(1) }
    );
    if (tab === "documents") return showDocuments(id);
    if (tab === "ask") {
      loadConversations(id);
      return $("ask-question").focus();
    }
    if (tab === "tune") return showTune(id);
    if (tab === "quality") return showQuality(id);
  }

  // ------------------------------------------------------------------ documents

  async function showDocuments(cid) {
    await refreshDocuments(cid);
  }

  async function refreshDocuments(cid) {
    stopPolling();
    let docs = [];
    try {
      // Walk every page so the list is complete for collections of any size.
      let cursor = null;
      do {
        const q = "?limit=500" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : "");
        const page = await api("GET", "/v1/collections/" + encodeURIComponent(cid) + "/documents" + q);
        docs = docs.concat(page.documents);
        cursor = page.next_cursor;
      } while (cursor);
    } catch (err) {
      banner(err.message);
    }
    if (state.view !== "collection" || $("pane-documents").hidden) return;
    renderDocuments(docs);
    // Poll while the tab is open: fast while anything is still moving, slower otherwise.
    const moving = docs.some((d) => d.status !== "indexed" && d.status !== "failed");
    state.pollTimer = setTimeout(() => refreshDocuments(cid), moving ? POLL_MS : 5 * POLL_MS);
  }

  function renderDocuments(docs) {
    const body = $("documents-body");
    clear(body);
    $("documents-empty").hidden = docs.length > 0;
    for (const d of docs) {
      const status = STATUSES.includes(d.status) ? d.status : "other";
      body.appendChild(
        el(
          "tr",
          { "data-id": d.id, "data-status": d.status },
          el("td", {}, el("span", { class: "filename", text: d.filename }),
            el("div", { class: "muted", text: d.media_type })),
          el(
            "td",
            {},
            el("span", { class: "badge " + status, text: d.status }),
            d.error ? el("span", { class: "reason", text: d.error }) : null
          ),
          el("td", { text: d.chunk_count }),
          el("td", { text: bytes(d.size) }),
          el("td", { text: when(d.updated_at || d.created_at) }),
          el(
            "td",
            {},
            el("button", {
              class: "danger",
              type: "button",
              text: "Delete",
              onclick: () => deleteDocument(d),
            })
          )
        )
      );
    }
  }

  async function deleteDocument(d) {
    if (!confirm("Delete “" + d.filename + "”? It leaves every answer at once.")) return;
    try {
      await api("DELETE", "/v1/documents/" + encodeURIComponent(d.id));
    } catch (err) {
      return banner(err.message);
    }
    refreshDocuments(state.collection.id);
  }

  async function upload(files) {
    if (!files.length || !state.collection) return;
    const form = new FormData();
    for (const f of files) form.append("files", f, f.name);
    const status = $("upload-status");
    status.textContent = "Uploading " + files.length + " file(s)…";
    try {
      const r = await api("POST", "/v1/collections/" + encodeURIComponent(state.collection.id) + "/documents", form);
      const dup = r.documents.filter((d) => d.duplicate).length;
      status.textContent =
        "Accepted " + r.documents.length + " file(s)" + (dup ? " (" + dup + " already present)" : "") + ".";
    } catch (err) {
      status.textContent = "";
      banner(err.message);
    }
    refreshDocuments(state.collection.id);
  }

  const drop = $("dropzone");
  for (const name of ["dragenter", "dragover"]) {
    drop.addEventListener(name, (e) => {
      e.preventDefault();
      drop.classList.add("over");
    });
  }
  for (const name of ["dragleave", "drop"]) {
    drop.addEventListener(name, () => drop.classList.remove("over"));
  }
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    upload(Array.from(e.dataTransfer.files));
  });
  // A file dropped outside the zone must not make the browser navigate to it.
  window.addEventListener("dragover", (e) => e.preventDefault());
  window.addEventListener("drop", (e) => e.preventDefault());
  $("file-input").addEventListener("change", (e) => {
    upload(Array.from(e.target.files));
    e.target.value = "";
  });

  // ------------------------------------------------------------------ ask

  function resetAsk() {
    if (state.ask) state.ask.abort();
    state.ask = null;
    clear($("answer"));
    clear($("passages"));
    clear($("timings-body"));
    $("answer-usage").textContent = "";
    $("answer-searched").hidden = true;
    $("answer-state").textContent = "";
    $("answer-state").className = "badge";
    $("citation").hidden = true;
    $("feedback").hidden = true;
    $("feedback").dataset.answerId = "";
    $("feedback-comment").value = "";
    $("feedback-status").textContent = "";
    for (const b of $("feedback").querySelectorAll("button")) b.classList.remove("chosen");
  }

  // Buttons under each answer: a rating (and an optional comment) for its answer id; a
  // second click replaces the first.
  for (const button of [$("feedback-up"), $("feedback-down")]) {
    button.addEventListener("click", async () => {
      const id = $("feedback").dataset.answerId;
      if (!id) return;
      const body = { rating: button.dataset.rating };
      const comment = $("feedback-comment").value.trim();
      if (comment) body.comment = comment;
      try {
        await api("POST", "/v1/answers/" + encodeURIComponent(id) + "/feedback", body);
      } catch (err) {
        $("feedback-status").textContent = err.message;
        return;
      }
      for (const b of $("feedback").querySelectorAll("button")) b.classList.toggle("chosen", b === button);
      $("feedback-status").textContent = "Thanks: recorded.";
    });
  }

  $("ask-form").addEventListener("submit", (event) => {
    event.preventDefault();
    ask($("ask-question").value.trim());
  });
  $("ask-question").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      $("ask-form").requestSubmit();
    }
  });
  $("ask-stop").addEventListener("click", () => state.ask && state.ask.abort());

  async function ask(question) {
    if (!question || !state.collection) return;
    resetAsk();
    banner(null);
    const controller = new AbortController();
    state.ask = controller;
    const run = { text: "", passages: [], citations: null };
    const stateBadge = $("answer-state");
    stateBadge.textContent = "retrieving";
    stateBadge.className = "badge streaming";
    $("ask-submit").disabled = true;
    $("ask-stop").hidden = false;
    const body = { question, stream: true };
    const k = intOrNull($("ask-k"));
    const maxTokens = intOrNull($("ask-max-tokens"));
    if (k) body.k = k;
    if (maxTokens) body.max_tokens = maxTokens;
    const evidence = $("ask-evidence").value;
    if (evidence) body.evidence = evidence;
    const conversation = $("conversation-select").value;
    if (conversation) body.conversation_id = conversation;
    try {
      const r = await fetch("/v1/collections/" + encodeURIComponent(state.collection.id) + "/ask", {
        method: "POST",
        headers: {
          Authorization: "Bearer " + apiKey(),
          "Content-Type": "application/json",
          Accept: "text/event-stream",
        },
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (r.status === 401) return signOut("Your API key was refused; sign in again.");
      if (!r.ok) {
        const data = await r.json().catch(() => null);
        throw new ApiError(r.status, errorMessage(r, data));
      }
      for await (const ev of sseEvents(r)) {
        const kind = kindOf(ev);
        if (kind === "passages") {
          run.passages = ev.data.passages || [];
          renderPassages(run.passages);
          if (ev.data.timings_ms || ev.data.timings) renderTimings(ev.data.timings_ms || ev.data.timings);
          stateBadge.textContent = "generating";
        } else if (kind === "token") {
          run.text += tokenText(ev.data);
          renderAnswer(run);
        } else if (kind === "final") {
          run.citations = ev.data.citations || [];
          // The final answer is authoritative (the server may have trimmed a stop string).
          if (typeof ev.data.answer === "string") run.text = ev.data.answer;
          renderAnswer(run);
          renderTimings(ev.data.timings_ms || ev.data.timings || {});
          renderUsage(ev.data);
          renderSearched(question, ev.data.searched_query);
          if (conversation) showConversation(conversation);
          if (ev.data.answer_id) {
            $("feedback").dataset.answerId = ev.data.answer_id;
            $("feedback").hidden = false;
          }
          stateBadge.textContent = ev.data.finish_reason || "done";
          stateBadge.className = "badge done";
        } else if (kind === "error") {
          const e = ev.data.error || ev.data;
          throw new ApiError(0, (e && e.message) || "the answer failed");
        }
      }
      if (run.citations === null) {
        stateBadge.textContent = "incomplete";
        stateBadge.className = "badge error";
      }
    } catch (err) {
      if (err.name === "AbortError") {
        stateBadge.textContent = "stopped";
        stateBadge.className = "badge";
      } else {
        stateBadge.textContent = "error";
        stateBadge.className = "badge error";
        banner(err.message);
      }
    } finally {
      if (state.ask === controller) state.ask = null;
      $("ask-submit").disabled = false;
      $("ask-stop").hidden = true;
    }
  }

  // What the answer searched, when a follow-up was made a question of its own.
  function renderSearched(question, searched) {
    const p = $("answer-searched");
    p.hidden = !searched || searched === question;
    p.textContent = p.hidden ? "" : "Searched: " + searched;
  }

  // ------------------------------------------------------------------ conversations

  function conversationsPath(cid) {
    return "/v1/collections/" + encodeURIComponent(cid) + "/conversations";
  }

  async function loadConversations(cid, selected) {
    const select = $("conversation-select");
    const keep = selected !== undefined ? selected : select.value;
    let page;
    try {
      page = await api("GET", conversationsPath(cid) + "?limit=50");
    } catch (err) {
      return banner(err.message);
    }
    while (select.options.length > 1) select.remove(1);
    for (const c of page.conversations) {
      const label = (c.first_question || "(empty)").slice(0, 60) + " · " + c.turn_count + " turns";
      select.appendChild(el("option", { value: c.id, text: label }));
    }
    select.value = page.conversations.some((c) => c.id === keep) ? keep : "";
    showConversation(select.value);
  }

  async function showConversation(id) {
    const list = $("conversation-turns");
    clear(list);
    $("conversation-delete").hidden = !id;
    if (!id || !state.collection) return;
    let conv;
    try {
      conv = await api("GET", conversationsPath(state.collection.id) + "/" + encodeURIComponent(id));
    } catch (err) {
      return banner(err.message);
    }
    for (const t of conv.turns) {
      const item = el("li", { class: "turn" }, el("p", { class: "question", text: t.question }));
      if (t.searched_query && t.searched_query !== t.question) {
        item.appendChild(el("p", { class: "muted searched", text: "Searched: " + t.searched_query }));
      }
      item.appendChild(el("p", { class: "turn-answer", text: t.answer }));
      list.appendChild(item);
    }
    if (conv.erased_turns) {
      list.appendChild(el("li", { class: "muted", text: conv.erased_turns +
        " turns erased: a document they cited was deleted" }));
    }
  }

  $("conversation-select").addEventListener("change", (e) => showConversation(e.target.value));
  $("conversation-new").addEventListener("click", async () => {
    if (!state.collection) return;
    try {
      const c = await api("POST", conversationsPath(state.collection.id));
      await loadConversations(state.collection.id, c.id);
      $("ask-question").focus();
    } catch (err) {
      banner(err.message);
    }
  });
  $("conversation-delete").addEventListener("click", async () => {
    const id = $("conversation-select").value;
    if (!id || !state.collection) return;
    try {
      await api("DELETE", conversationsPath(state.collection.id) + "/" + encodeURIComponent(id));
      await loadConversations(state.collection.id, "");
    } catch (err) {
      banner(err.message);
    }
  });

  // The answer with its [n] markers turned into citation links. Until the final event the
  // markers point at the numbered passages; after it, at the server's citations.
  function renderAnswer(run) {
    const out = $("answer");
    clear(out);
    const re = /\[(\d+)\]/g;
    let last = 0;
    let m;
    while ((m = re.exec(run.text)) !== null) {
      append(out, run.text.slice(last, m.index));
      const n = Number(m[1]);
      const target = citationFor(run, n);
      if (target) {
        out.appendChild(
          el("a", {
            class: "cite",
            href: "#",
            role: "button",
            "data-marker": n,
            title: target.filename || "",
            text: String(n),
            onclick: (e) => {
              e.preventDefault();
              for (const a of out.querySelectorAll(".cite.open")) a.classList.remove("open");
              e.currentTarget.classList.add("open");
              openCitation(n, target);
            },
          })
        );
      } else {
        append(out, m[0]);
      }
      last = re.lastIndex;
    }
    append(out, run.text.slice(last));
  }

  function citationFor(run, n) {
    if (run.citations) {
      const c = run.citations.find((c) => Number(c.marker ?? c.n) === n);
      if (c) return c;
    }
    const p = run.passages[n - 1];
    return p ? { marker: n, ...p } : null;
  }

  // Open the cited passage where it stands in its document: the cited span (document
  // character offsets) highlighted, with the text of the neighbouring chunks around it.
  async function openCitation(n, c) {
    const box = $("citation");
    const text = $("citation-text");
    $("citation-title").textContent = "[" + n + "] " + (c.filename || c.document_id);
    clear(text);
    append(text, "Loading…");
    box.hidden = false;
    let chunks;
    try {
      chunks = await citedChunks(c);
    } catch (err) {
      clear(text);
      return append(text, err.message);
    }
    clear(text);
    if (!chunks) return append(text, "The cited passage is no longer available.");
    const { chunk, around } = chunks;
    const start = c.start_char ?? chunk.start_char;
    const end = Math.max(start, c.end_char ?? chunk.end_char);
    const first = around[0];
    const last = around[around.length - 1];
    const lo = Math.max(first.start_char, start - CONTEXT_CHARS);
    const hi = Math.min(last.end_char, end + CONTEXT_CHARS);
    if (lo > first.start_char || first.ordinal > 0) append(text, "…");
    append(text, el("span", { class: "context", text: textBetween(around, lo, start) }));
    const mark = el("mark", { class: "cited", text: textBetween(around, start, end) });
    text.appendChild(mark);
    append(text, el("span", { class: "context", text: textBetween(around, end, hi) }));
    if (hi < last.end_char) append(text, "…");
    $("citation-title").textContent += " · characters " + start + "–" + end;
    mark.scrollIntoView({ block: "nearest" });
  }

  // The cited chunk, found by id (or else by the cited offset), with its neighbours.
  async function citedChunks(c) {
    const base = "/v1/documents/" + encodeURIComponent(c.document_id) + "/chunks";
    const limit = 1000;
    let chunk = null;
    let fallback = null;
    for (let offset = 0; !chunk; offset += limit) {
      const page = await api("GET", base + "?limit=" + limit + "&offset=" + offset);
      for (const ch of page.chunks) {
        if (ch.id === c.chunk_id || ch.uid === c.chunk_id) chunk = ch;
        if (!fallback && c.start_char >= ch.start_char && c.start_char < ch.end_char) fallback = ch;
      }
      if (page.chunks.length < limit) break;
    }
    chunk = chunk || fallback;
    if (!chunk) return null;
    // Chunks are listed by ordinal, so the neighbours are the ones either side of it.
    const page = await api("GET", base + "?limit=3&offset=" + Math.max(0, chunk.ordinal - 1));
    const around = page.chunks.some((ch) => ch.id === chunk.id) ? page.chunks : [chunk];
    return { chunk, around };
  }

  // The document's text between two character offsets, from its chunks: each chunk is the
  // document's text between its own offsets, and neighbours overlap or leave out only what
  // the tokenizer skipped between them (whitespace), which comes back as one space.
  function textBetween(chunks, from, to) {
    let out = "";
    let pos = from;
    for (const ch of chunks) {
      if (ch.end_char <= pos || ch.start_char >= to) continue;
      if (ch.start_char > pos) {
        out += " ";
        pos = ch.start_char;
      }
      out += ch.text.slice(pos - ch.start_char, to - ch.start_char);
      pos = Math.min(to, ch.end_char);
    }
    return out;
  }

  function renderPassages(passages) {
    const list = $("passages");
    clear(list);
    passages.forEach((p, i) => {
      const score = typeof p.score === "number" ? " · score " + p.score.toFixed(3) : "";
      list.appendChild(
        el(
          "li",
          { "data-chunk": p.chunk_id, value: i + 1 },
          el("div", { class: "meta", text: (p.filename || p.document_id) + score }),
          el("pre", { class: "passage-text", text: p.text || "" })
        )
      );
    });
  }

  function renderTimings(timings) {
    const body = $("timings-body");
    clear(body);
    for (const [stage, ms] of Object.entries(timings || {})) {
      const v = typeof ms === "number" ? ms.toFixed(1) + " ms" : String(ms);
      body.appendChild(el("tr", { "data-stage": stage }, el("td", { text: stage }), el("td", { text: v })));
    }
  }

  function renderUsage(d) {
    const u = d.usage || {};
    const parts = [];
    // How the answer was made: "quoted" (a passage's sentence), "generated", "refused".
    if (d.answer_source) parts.push(d.answer_source);
    const cached = u.cached_tokens ?? u.cached_prompt_tokens;
    const generated = u.generated_tokens ?? u.completion_tokens;
    if (u.prompt_tokens !== undefined) parts.push(u.prompt_tokens + " prompt tokens");
    if (cached) parts.push(cached + " cached");
    if (generated !== undefined) parts.push(generated + " generated tokens");
    if (d.finish_reason) parts.push("finish: " + d.finish_reason);
    $("answer-usage").textContent = parts.join(" · ");
  }

  // ------------------------------------------------------------------ tune

  async function showTune(cid) {
    $("tune-body").hidden = true;
    $("tune-empty").hidden = true;
    $("tune-status").textContent = "";
    let t;
    try {
      t = await api("GET", "/v1/collections/" + encodeURIComponent(cid) + "/tuning");
    } catch (err) {
      if (err.status === 404) {
        $("tune-empty").textContent =
          "This collection has not been tuned yet. Run `rag tune " + cid +
          "` on the server to measure recall against latency for its own data.";
        $("tune-empty").hidden = false;
        return;
      }
      return banner(err.message);
    }
    renderTune(t);
  }

  function currentPoint(t) {
    const d = t.search_defaults || {};
    return t.points.findIndex((p) => (p.knob ? d[p.knob] === p.value : true));
  }

  function renderTune(t) {
    $("tune-body").hidden = false;
    const points = t.points;
    const current = currentPoint(t);
    let selected = current >= 0 ? current : 0;
    const measured = t.measured_at ? new Date(t.measured_at * 1000).toLocaleString() : "";
    $("tune-meta").textContent =
      t.kind + " index · recall@" + t.k + " against exact search · " + t.queries + " queries · target " +
      t.target_recall + (t.budget_ms ? " within " + t.budget_ms + " ms" : "") +
      (measured ? " · measured " + measured : "");

    $("tune-knob").textContent = (points.find((p) => p.knob) || {}).knob || "setting";
    const rows = $("tune-points");
    function draw() {
      drawChart($("tune-chart"), t, current, selected, (i) => {
        selected = i;
        draw();
      });
      clear(rows);
      points.forEach((p, i) => {
        const radio = el("input", {
          type: "radio",
          name: "tune-point",
          value: i,
          checked: i === selected,
          disabled: !p.knob,
          onchange: () => {
            selected = i;
            draw();
          },
        });
        const notes = [];
        if (i === current) notes.push("current default");
        if (t.chosen && t.chosen.knob === p.knob && t.chosen.value === p.value) notes.push("tune's pick");
        rows.appendChild(
          el(
            "tr",
            { class: i === current ? "current" : "", "data-value": p.value ?? "" },
            el("td", {}, radio),
            el("td", { text: p.value ?? "—" }),
            el("td", { text: p.recall.toFixed(3) }),
            el("td", { text: p.p50_ms.toFixed(2) }),
            el("td", { text: p.p99_ms.toFixed(2) }),
            el("td", { class: "muted note", text: notes.join(", ") })
          )
        );
      });
      $("tune-apply").disabled = !points[selected] || !points[selected].knob || selected === current;
    }
    draw();

    $("tune-form").onsubmit = async (event) => {
      event.preventDefault();
      const p = points[selected];
      if (!p || !p.knob) return;
      // The PUT replaces the defaults: keep the others, swap the tuned knob.
      const defaults = { ...(t.search_defaults || {}) };
      delete defaults.ef_search;
      delete defaults.nprobe;
      defaults[p.knob] = p.value;
      try {
        const c = await api(
          "PUT",
          "/v1/collections/" + encodeURIComponent(t.collection_id) + "/search-defaults",
          defaults
        );
        state.collection = c;
      } catch (err) {
        return banner(err.message);
      }
      await showTune(t.collection_id);
      $("tune-status").textContent = "Searches now use " + p.knob + "=" + p.value + " by default.";
    };
  }

  // ------------------------------------------------------------------ quality

  $("quality-hours").addEventListener("change", () => state.collection && showQuality(state.collection.id));

  async function showQuality(cid) {
    const hours = Number($("quality-hours").value);
    const path = "/v1/collections/" + encodeURIComponent(cid);
    let q, t;
    try {
      [q, t] = await Promise.all([
        api("GET", path + "/quality?hours=" + hours + "&buckets=24"),
        api("GET", path + "/unanswered?days=" + Math.max(hours / 24, 1 / 24)),
      ]);
    } catch (err) {
      return banner(err.message);
    }
    renderQuality(q);
    renderTopics(t);
  }

  function renderQuality(q) {
    const tot = q.totals;
    $("quality-totals").textContent =
      tot.answers + " answers · " + tot.refused + " refused · " + tot.weak + " weak evidence · " +
      tot.feedback_up + " up, " + tot.feedback_down + " down";
    const drift = $("quality-drift");
    clear(drift);
    const kinds = { questions: "Questions", content: "New documents" };
    for (const kind of ["questions", "content"]) {
      const d = q.drift.find((x) => x.kind === kind);
      const text = d
        ? kinds[kind] + (d.alert ? ": drifted" : ": steady") + " (score " + d.score.toFixed(2) + ")"
        : kinds[kind] + ": not tested yet";
      drift.appendChild(el("span", {
        class: "badge " + (d && d.alert ? "error" : d ? "done" : ""), "data-kind": kind,
        "data-alert": d ? String(d.alert) : "", text,
        title: d ? "statistic " + d.statistic.toExponential(2) + " / threshold " +
          d.threshold.toExponential(2) + (d.pinned ? " · reference pinned" : "") : "",
      }));
    }
    const hours = Number($("quality-hours").value);
    const labels = q.buckets.map((b) => {
      const d = new Date(b.start);
      return hours <= 24 ? d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })
        : d.toLocaleDateString([], { month: "short", day: "numeric" });
    });
    const pick = (f) => q.buckets.map(f);
    drawSeries($("chart-sources"), labels, [
      { name: "generated", values: pick((b) => b.answer_source.generated || 0) },
      { name: "quoted", values: pick((b) => b.answer_source.quoted || 0) },
      { name: "refused", values: pick((b) => b.answer_source.refused || 0) },
      { name: "cut short", values: pick((b) => (b.finish_reason.deadline || 0) + (b.finish_reason.error || 0) + (b.finish_reason.length || 0)) },
    ], "answers");
    drawSeries($("chart-scores"), labels, [
      { name: "top score", values: pick((b) => b.top_score) },
      { name: "gap to next", values: pick((b) => b.score_gap) },
    ], "cosine");
    drawSeries($("chart-latency"), labels, [
      { name: "first token", values: pick((b) => b.first_token_ms) },
      { name: "answer", values: pick((b) => b.latency_ms) },
    ], "ms");
    drawSeries($("chart-feedback"), labels, [
      { name: "up", values: pick((b) => b.feedback_up) },
      { name: "unsupported", values: pick((b) => b.unsupported) },
      { name: "down", values: pick((b) => b.feedback_down) },
    ], "count");
  }

  function renderTopics(t) {
    const list = $("topics");
    clear(list);
    $("topics-empty").hidden = t.topics.length > 0;
    for (const topic of t.topics) {
      const docs = topic.documents.map((d) => d.filename).join(", ");
      const li = el("li", { "data-count": topic.count },
        el("strong", { text: topic.count + " questions" }),
        " (" + topic.refused + " refused)" + (docs ? " · nearest documents: " + docs : ""));
      if (topic.examples.length) {
        const ul = el("ul", { class: "examples" });
        for (const ex of topic.examples) ul.appendChild(el("li", { text: ex }));
        li.appendChild(ul);
      }
      list.appendChild(li);
    }
  }

  // ------------------------------------------------------------------ start

  window.addEventListener("hashchange", route);
  route();
})();
