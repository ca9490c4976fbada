// ragserve console: server-sent events read from a fetch() response (EventSource cannot
// POST). The ask stream is `passages`, then `token`s, then `final`.

// Parse a server-sent-event stream read with fetch(): EventSource cannot POST.
export async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      const ev = parseEvent(block);
      if (ev) yield ev;
    }
  }
  const ev = parseEvent(buffer);
  if (ev) yield ev;
}

function parseEvent(block) {
  let name = "message";
  const data = [];
  for (const line of block.split(/\r?\n/)) {
    if (!line || line.startsWith(":")) continue;
    const i = line.indexOf(":");
    const field = i < 0 ? line : line.slice(0, i);
    const value = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
    if (field === "event") name = value;
    else if (field === "data") data.push(value);
  }
  if (!data.length) return null;
  const raw = data.join("\n");
  if (raw === "[DONE]") return null;
  let parsed;
  try {
    parsed = JSON.parse(raw);
  } catch (_) {
    parsed = { text: raw };
  }
  return { name, data: parsed };
}

// The event's role, from its name or else from its shape.
export function kindOf(ev) {
  const d = ev.data || {};
  const n = ev.name;
  if (n === "error" || (d.error && !d.citations)) return "error";
  if (n === "passages" || n === "retrieval" || n === "context") return "passages";
  if (n === "token" || n === "delta") return "token";
  if (n === "done" || n === "final" || n === "end" || n === "citations") return "final";
  if (Array.isArray(d.citations) || d.finish_reason) return "final";
  if (Array.isArray(d.passages)) return "passages";
  return "token";
}

export function tokenText(d) {
  if (typeof d === "string") return d;
  if (typeof d.text === "string") return d.text;
  if (typeof d.delta === "string") return d.delta;
  if (typeof d.token === "string") return d.token;
  if (typeof d.content === "string") return d.content;
  return "";
}
