// The API reference: reads openapi.json (relative, so it works under a
// sub-path behind nginx) and lists every route with its parameters,
// request body and answers. Text goes into the page only as text nodes.
"use strict";

const METHODS = ["get", "post", "put", "patch", "delete"];

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// inline renders `code` spans of a description line as <code>.
function inline(text) {
  const out = document.createDocumentFragment();
  String(text).split(/(`[^`]*`)/).forEach((part) => {
    if (part.startsWith("`") && part.endsWith("`") && part.length > 1) out.append(el("code", null, part.slice(1, -1)));
    else if (part) out.append(document.createTextNode(part));
  });
  return out;
}

// paragraphs renders blank-line separated paragraphs; a paragraph whose
// lines start with "- " is a list.
function paragraphs(text) {
  const box = document.createDocumentFragment();
  String(text || "").split(/\n\s*\n/).forEach((p) => {
    const t = p.trim();
    if (!t) return;
    if (t.startsWith("- ")) {
      const list = el("ul");
      t.split(/\n\s*-\s+/).forEach((item) => list.append(el("li", null, inline(item.replace(/^-\s+/, "").replace(/\s*\n\s*/g, " ")))));
      box.append(list);
      return;
    }
    box.append(el("p", null, inline(t.replace(/\s*\n\s*/g, " "))));
  });
  return box;
}

function refName(ref) {
  return ref ? ref.split("/").pop() : "";
}

function resolve(doc, obj) {
  if (obj && obj.$ref) {
    const parts = obj.$ref.replace(/^#\//, "").split("/");
    let cur = doc;
    for (const p of parts) cur = cur ? cur[p] : undefined;
    return cur || obj;
  }
  return obj;
}

function schemaText(doc, schema) {
  if (!schema) return "";
  if (schema.$ref) return refName(schema.$ref);
  if (schema.type === "array") return "array of " + schemaText(doc, schema.items);
  if (schema.enum) return schema.enum.join(" | ");
  if (schema.oneOf) return schema.oneOf.map((s) => schemaText(doc, s)).join(" or ");
  return schema.type || "object";
}

function anchor(method, path) {
  return (method + "-" + path).replace(/[^A-Za-z0-9]+/g, "-");
}

function renderOp(doc, path, method, op, pathItem) {
  const box = el("article", { class: "op", id: anchor(method, path), "data-route": method.toUpperCase() + " " + path });
  box.append(el("h3", null, el("span", { class: "method " + method }, method.toUpperCase()), el("span", { class: "path" }, path)));
  if (op.summary) box.append(el("p", { class: "summary" }, inline(op.summary)));
  if (op.description) box.append(paragraphs(op.description));
  const listeners = op["x-listeners"] || pathItem["x-listeners"];
  if (listeners) box.append(el("p", { class: "listeners" }, "listeners: " + listeners.join(", ")));
  if (op.security && op.security.length === 0) box.append(el("p", { class: "hint" }, "no token needed"));

  const params = [...(pathItem.parameters || []), ...(op.parameters || [])].map((p) => resolve(doc, p));
  if (params.length) {
    const t = el("table", null, el("tr", null, el("th", null, "parameter"), el("th", null, "in"), el("th", null, "type"), el("th", null, "what")));
    params.forEach((p) => t.append(el("tr", null, el("td", null, el("code", null, p.name)), el("td", null, p.in),
      el("td", null, schemaText(doc, p.schema)), el("td", null, inline(p.description || "")))));
    box.append(t);
  }
  const body = op.requestBody && resolve(doc, op.requestBody);
  if (body && body.content) {
    const [ctype, media] = Object.entries(body.content)[0];
    box.append(el("p", null, "Body (", el("code", null, ctype), "): ", schemaText(doc, media.schema)));
  }
  const answers = el("table", null, el("tr", null, el("th", null, "status"), el("th", null, "answer")));
  for (const [status, r] of Object.entries(op.responses || {})) {
    const res = resolve(doc, r);
    answers.append(el("tr", null, el("td", null, el("code", null, status)), el("td", null, inline(res.description || refName(r.$ref)))));
  }
  box.append(answers);
  return box;
}

async function main() {
  const ops = document.getElementById("api-ops");
  const toc = document.getElementById("api-toc");
  let doc;
  try {
    const r = await fetch("openapi.json", { headers: { Accept: "application/json" } });
    if (!r.ok) throw new Error("openapi.json answered " + r.status);
    doc = await r.json();
  } catch (e) {
    const box = document.getElementById("api-error");
    box.textContent = "The API description could not be loaded: " + e.message;
    box.hidden = false;
    return;
  }
  const info = doc.info || {};
  document.getElementById("api-title").textContent = (info.title || "API") + " API reference";
  document.getElementById("api-version").textContent = "OpenAPI " + doc.openapi + ", version " + info.version;
  document.getElementById("api-intro").append(paragraphs(info.description));

  const byTag = new Map();
  for (const [path, item] of Object.entries(doc.paths || {})) {
    for (const m of METHODS) {
      const op = item[m];
      if (!op) continue;
      const tag = (op.tags && op.tags[0]) || "other";
      if (!byTag.has(tag)) byTag.set(tag, []);
      byTag.get(tag).push([path, m, op, item]);
    }
  }
  const order = (doc.tags || []).map((t) => t.name);
  const tags = [...byTag.keys()].sort((a, b) => (order.indexOf(a) + 1 || 99) - (order.indexOf(b) + 1 || 99));
  let count = 0;
  for (const tag of tags) {
    toc.append(el("h3", null, tag));
    for (const [path, m, op, item] of byTag.get(tag)) {
      toc.append(el("a", { href: "#" + anchor(m, path) }, m.toUpperCase() + " " + path));
      ops.append(renderOp(doc, path, m, op, item));
      count++;
    }
  }
  document.body.dataset.routes = String(count);
}

main();
