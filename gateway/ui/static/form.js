// The answer form of an elicitation: one labelled control per property of the requested schema (the
// restricted, flat JSON Schema MCP elicitation allows), and the answer's `content` read back typed.

import { el } from "./format.js";

/** The allowed values of a property, when it is an enum (plain `enum`, or `oneOf` of `const`s). */
function choices(property) {
  if (Array.isArray(property.enum)) {
    return property.enum.map((value, i) => ({ value, label: property.enumNames?.[i] ?? String(value) }));
  }
  const options = property.oneOf ?? property.anyOf ?? property.items?.anyOf;
  if (Array.isArray(options) && options.every((option) => "const" in option)) {
    return options.map((option) => ({ value: option.const, label: option.title ?? String(option.const) }));
  }
  return null;
}

export function renderForm(container, schema) {
  const required = new Set(schema.required ?? []);
  const fields = Object.entries(schema.properties ?? {}).map(([name, property], index) => {
    const id = `input-field-${index}`;
    const label = el("label", { for: id }, `${property.title ?? name}${required.has(name) ? " *" : ""}`);
    const hint = property.description ? el("small", { id: `${id}-hint` }, property.description) : "";
    const common = { id, name, "aria-describedby": property.description ? `${id}-hint` : null };
    const options = choices(property);
    let control;
    if (property.type === "boolean") {
      control = el("input", { ...common, type: "checkbox", checked: property.default === true });
      return el("div", { class: "field checkbox" }, [control, label, hint]);
    }
    if (options) {
      control = el(
        "select",
        { ...common, required: required.has(name) },
        [
          ...(required.has(name) ? [] : [el("option", { value: "" }, "—")]),
          ...options.map((option) =>
            el("option", { value: JSON.stringify(option.value), selected: option.value === property.default }, option.label),
          ),
        ],
      );
    } else if (property.type === "number" || property.type === "integer") {
      control = el("input", {
        ...common,
        type: "number",
        step: property.type === "integer" ? "1" : "any",
        min: property.minimum,
        max: property.maximum,
        value: property.default,
        required: required.has(name),
      });
    } else {
      const type = { email: "email", uri: "url", date: "date", "date-time": "datetime-local" }[property.format] ?? "text";
      control = el("input", {
        ...common,
        type,
        minlength: property.minLength,
        maxlength: property.maxLength,
        value: property.default,
        required: required.has(name),
      });
    }
    return el("div", { class: "field" }, [label, control, hint]);
  });
  container.replaceChildren(...fields);
}

/** The form's values as the schema types them; an empty optional field is left out. */
export function readForm(form, schema) {
  const content = {};
  for (const [name, property] of Object.entries(schema.properties ?? {})) {
    const control = form.elements.namedItem(name);
    if (!control) continue;
    if (property.type === "boolean") {
      content[name] = control.checked;
    } else if (control.value === "") {
      continue;
    } else if (control.tagName === "SELECT") {
      content[name] = JSON.parse(control.value);
    } else if (property.type === "number" || property.type === "integer") {
      content[name] = Number(control.value);
    } else {
      content[name] = control.value;
    }
  }
  return content;
}
