// ragserve console: DOM helpers. Text from the server only ever goes in as text nodes or
// textContent, never as HTML.

const SVG_NS = "http://www.w3.org/2000/svg";

export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = String(value);
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) append(node, child);
  return node;
}

export function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, String(value));
  }
  if (text !== undefined) node.textContent = String(text);
  return node;
}

export function append(node, child) {
  if (child === undefined || child === null || child === false) return;
  node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}
