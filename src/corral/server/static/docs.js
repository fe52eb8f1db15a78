// The API reference at /docs (and /redoc): the app's own openapi.json as a page, built with
// DOM text only (no innerHTML) and no CDN: corral may run offline. Every request it makes
// is same-origin, so a host app's cookie authentication applies as to the API.

const $ = (sel) => document.querySelector(sel);

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function refName(schema) {
  return schema && schema.$ref ? schema.$ref.split("/").pop() : null;
}

function typeOf(schema) {
  if (!schema) return "";
  const ref = refName(schema);
  if (ref) return ref;
  if (schema.anyOf) return schema.anyOf.map(typeOf).join(" | ");
  if (schema.type === "array") return `${typeOf(schema.items)}[]`;
  if (schema.enum) return schema.enum.map((v) => JSON.stringify(v)).join(" | ");
  return schema.type || "object";
}

function fieldsTable(schema, components) {
  const target = refName(schema) ? components[refName(schema)] : schema;
  if (!target || !target.properties) return null;
  const table = el("table");
  const head = el("tr");
  for (const h of ["field", "type", "description"]) head.append(el("th", "", h));
  table.append(head);
  const required = new Set(target.required || []);
  for (const [name, prop] of Object.entries(target.properties)) {
    const row = el("tr");
    row.append(el("td", "", name + (required.has(name) ? " *" : "")), el("td", "", typeOf(prop)),
               el("td", "", prop.description || ""));
    table.append(row);
  }
  return table;
}

function operation(path, method, op, components) {
  const box = el("article", "op");
  box.id = `${method}-${path}`.replace(/[^A-Za-z0-9_-]/g, "_");
  const title = el("h3");
  title.append(el("span", `method ${method}`, method.toUpperCase()), document.createTextNode(path));
  box.append(title);
  if (op.summary) box.append(el("p", "", op.summary));
  if (op.description) box.append(el("p", "muted", op.description));
  const params = op.parameters || [];
  if (params.length) {
    box.append(el("h4", "", "Parameters"));
    const table = el("table");
    for (const p of params) {
      const row = el("tr");
      row.append(el("td", "", p.name + (p.required ? " *" : "")), el("td", "", p.in),
                 el("td", "", typeOf(p.schema)), el("td", "", p.description || ""));
      table.append(row);
    }
    box.append(table);
  }
  const body = op.requestBody && op.requestBody.content && op.requestBody.content["application/json"];
  if (body) {
    box.append(el("h4", "", `Body: ${typeOf(body.schema)}`));
    const table = fieldsTable(body.schema, components);
    if (table) box.append(table);
  }
  box.append(el("h4", "", "Responses"));
  const table = el("table");
  for (const [status, resp] of Object.entries(op.responses || {})) {
    const json = resp.content && resp.content["application/json"];
    const row = el("tr");
    row.append(el("td", "", status), el("td", "", json ? typeOf(json.schema) : ""),
               el("td", "", resp.description || ""));
    table.append(row);
  }
  box.append(table);
  return box;
}

async function main() {
  const ops = $("#ops");
  let spec;
  try {
    const r = await fetch("openapi.json", { credentials: "same-origin" });
    if (!r.ok) throw new Error(`openapi.json answered ${r.status}`);
    spec = await r.json();
  } catch (e) {
    ops.replaceChildren(el("p", "error", `cannot load the API description: ${e.message}`));
    return;
  }
  document.title = `${spec.info.title} ${spec.info.version} API reference`;
  $("#version").textContent = `${spec.info.version} · OpenAPI ${spec.openapi}`;
  const components = (spec.components && spec.components.schemas) || {};
  const toc = $("#toc");
  const boxes = [el("p", "", spec.info.description || "")];
  for (const [path, item] of Object.entries(spec.paths || {})) {
    for (const [method, op] of Object.entries(item)) {
      const box = operation(path, method, op, components);
      boxes.push(box);
      const link = el("a", "", `${method.toUpperCase()} ${path}`);
      link.href = `#${box.id}`;
      toc.append(link);
    }
  }
  ops.replaceChildren(...boxes);
  document.body.dataset.loaded = String(boxes.length - 1);
}

main();
