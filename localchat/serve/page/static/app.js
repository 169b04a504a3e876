// The chat page: a face on serve's own conversations. Everything goes through /api (serve/page/api.py);
// text is shown with textContent or renderMarkdown (DOM nodes, never HTML).
"use strict";

const $ = (id) => document.getElementById(id);
const state = { chat: null, models: [], busy: false, pictures: [], mode: "ask", local: { history: true } };

function headers(json) {
  const h = json ? { "content-type": "application/json" } : {};
  const key = sessionStorage.getItem("localchat-key");
  if (key) h.authorization = `Bearer ${key}`;
  return h;
}

async function api(method, path, body, retried) {
  let response;
  try {
    response = await fetch(path, { method, headers: headers(body !== undefined),
                                   body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (error) {  // nothing answers: serve stopped, or the network is down
    throw new Error(`cannot reach the server at ${location.host}: is localchat serve still running? (${error.message})`);
  }
  if (response.status === 401 && !retried) {
    const key = window.prompt("This server wants its API key (kept for this tab only):");
    if (key) {
      sessionStorage.setItem("localchat-key", key.trim());
      return api(method, path, body, true);
    }
  }
  return response;
}

async function json(method, path, body) {
  const response = await api(method, path, body);
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(answer.error?.message || `HTTP ${response.status}`);
  return answer;
}

function say(text) { $("notice").textContent = text || ""; }

function node(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "text") el.textContent = v;
    else if (k.startsWith("data-")) el.setAttribute(k, v);
    else el[k] = v;
  }
  el.append(...children);
  return el;
}

// --- models, the list, one conversation ----------------------------------------------------------

async function loadModels() {
  state.models = await json("GET", "/api/models");
  const select = $("model");
  select.replaceChildren(...state.models.map((m) => node("option", { value: m.id, text: m.id })));
  showAttach();
}

function showAttach() {
  const model = state.models.find((m) => m.id === $("model").value);
  $("attach-label").hidden = !(model && model.vision);
}

async function loadList() {
  const q = $("search").value.trim();
  const items = await json("GET", `/api/chats${q ? `?q=${encodeURIComponent(q)}` : ""}`);
  $("conversations").replaceChildren(...items.map((c) => {
    const entry = node("button", { type: "button", className: "conversation", "data-testid": "conversation",
                                   "data-id": c.id, text: c.title || "(untitled)" });
    const when = c.updated ? ` · ${String(c.updated).slice(0, 16)}` : "";
    const turns = c.turns !== undefined ? ` · ${c.turns} turn${c.turns === 1 ? "" : "s"}` : "";
    entry.append(node("small", { className: "when", "data-testid": "conversation-meta", text: ` ${c.model || ""}${when}${turns}` }));
    if (state.chat && c.id === state.chat.id) entry.classList.add("current");
    entry.addEventListener("click", () => openChat(c.id));
    return entry;
  }));
}

async function openChat(id) {
  try {
    show(await json("GET", `/api/chats/${encodeURIComponent(id)}`));
    location.hash = id;
    document.body.classList.remove("side-open");
  } catch (error) {
    say(error.message);
  }
}

function show(chat) {
  const same = state.chat && state.chat.id === chat.id;
  state.chat = chat;
  if (state.models.some((m) => m.id === chat.model)) $("model").value = chat.model;
  $("history").checked = chat.history;
  shown($("temperature"), String(chat.temperature ?? 0), same);
  shown($("system"), chat.system || "", same);
  $("messages").replaceChildren(...chat.turns.flatMap(turnNodes));
  showAttach();
  scrollDown();
  loadList().catch(() => {});
}

// A field shows the conversation's value, unless the user is editing it: the answer to another
// change (the temperature's, sent as its box lost focus) must not undo what is being typed in the system box.
function shown(field, value, sameChat) {
  if (sameChat && field.value !== field.dataset.shown && field.value !== value) return;
  field.value = value;
  field.dataset.shown = value;
}

function turnNodes(turn) {
  const user = message("user", turn.user);
  for (const label of turn.images || []) user.prepend(node("div", { className: "picture-label", text: label }));
  const answer = message("assistant", turn.assistant);
  if (turn.reasoning) answer.prepend(folded("reasoning", turn.reasoning));
  for (const call of turn.calls || []) answer.prepend(folded(`tool call: ${call.name}`, JSON.stringify(call.arguments ?? call)));
  if (turn.figures) answer.append(node("div", { className: "figures", "data-testid": "figures", text: turn.figures }));
  return [user, answer];
}

function message(role, text) {
  const el = node("article", { className: `message ${role}`, "data-testid": "message", "data-role": role });
  const body = node("div", { className: "body" });
  if (role === "assistant") body.append(window.renderMarkdown(text));
  else body.textContent = text;
  el.append(body);
  return el;
}

function folded(title, text) {
  return node("details", { className: "folded" }, node("summary", { text: title }), node("pre", { text }));
}

function scrollDown() { $("messages").scrollTop = $("messages").scrollHeight; }

// --- a turn --------------------------------------------------------------------------------------

async function ensureChat() {
  if (state.chat) return state.chat;
  const chat = await json("POST", "/api/chats", { model: $("model").value, history: $("history").checked,
                                                 temperature: Number($("temperature").value),
                                                 system: $("system").value || null });
  state.chat = chat;
  location.hash = chat.id;
  return chat;
}

async function send(kind) {
  if (state.busy) return;
  const text = $("composer").value;
  if (kind !== "retry" && !text.trim()) return;
  busy(true);  // one send a turn: a second Enter while the conversation is made sends nothing
  say("");
  let chat;
  try {
    chat = await ensureChat();
  } catch (error) {
    busy(false);
    say(error.message);
    return;
  }
  const pictures = kind === "retry" ? [] : state.pictures.map((p) => p.url);
  const shown = $("messages");
  if (kind === "edit" || kind === "retry") {
    const all = shown.querySelectorAll("[data-testid=message]");
    all.forEach((m, i) => { if (i >= all.length - (kind === "edit" ? 2 : 1)) m.remove(); });
  }
  if (kind !== "retry") shown.append(message("user", text));
  const answer = message("assistant", "");
  shown.append(answer);
  $("composer").value = "";
  state.pictures = [];
  $("attached").replaceChildren();
  let ended = null;
  try {
    const response = await api("POST", `/api/chats/${encodeURIComponent(chat.id)}/turns`, { kind, text, images: pictures });
    if (!response.ok) {
      const error = await response.json().catch(() => ({}));
      throw new Error(error.error?.message || `HTTP ${response.status}`);
    }
    ended = await streamInto(response, answer, chat.id);
  } catch (error) {
    say(error.message);
    if (kind !== "retry" && !$("composer").value) $("composer").value = text;  // the question is kept to send again
  } finally {
    busy(false);
    state.mode = "ask";
    $("send").textContent = "Send";
  }
  if (ended && ended.stale) {
    await openChat(chat.id);  // continued elsewhere: the latest kept turns are shown, the question kept to send again
    if (kind !== "retry") $("composer").value = text;
  } else if (ended && !ended.kept && ended.status !== "stopped") {
    notKept([...shown.querySelectorAll("[data-testid=message]")].slice(kind === "retry" ? -1 : -2), ended);
  } else {
    await openChat(chat.id);  // the view is what history holds (a stopped reply is gone, as Ctrl+C leaves it)
  }
  if (ended && !ended.kept) say(`not kept (${ended.status}${ended.error ? `: ${ended.error}` : ""}): history is unchanged`);
  else if (ended && ended.note) say(ended.note);
}

function notKept(messages, ended) {
  // a reply shown but not kept (history off, cut, empty): it stays on screen, marked, out of history
  for (const m of messages) { m.classList.add("discarded"); m.setAttribute("data-kept", "false"); }
  const answer = messages[messages.length - 1];
  if (ended.figures && answer) {
    answer.append(node("div", { className: "figures", "data-testid": "figures", text: ended.figures }));
  }
}

async function streamInto(response, answer, id) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const body = answer.querySelector(".body");
  let buffer = "", text = "", reasoning = null, ended = null, drawn = false, loading = null;
  const draw = () => { drawn = false; body.replaceChildren(window.renderMarkdown(text)); scrollDown(); };
  const loaded = () => { if (loading) { clearInterval(loading); loading = null; answer.querySelector(".loading")?.remove(); } };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const line = buffer.slice(0, cut).trim();
      buffer = buffer.slice(cut + 2);
      if (!line.startsWith("data: ")) continue;
      const event = JSON.parse(line.slice(6));
      if (event.type === "loading") {  // the model loads first: said with the seconds so far, as the terminal's spinner
        const started = Date.now();
        const note = node("div", { className: "loading", "data-testid": "loading", text: `loading ${event.model}… 0s` });
        answer.insertBefore(note, body);
        loading = setInterval(() => { note.textContent = `loading ${event.model}… ${Math.round((Date.now() - started) / 1000)}s`; }, 500);
        continue;
      }
      if (event.type !== "end") loaded();
      if (event.type === "text") {
        text += event.text;
        if (!drawn) { drawn = true; requestAnimationFrame(draw); }
      } else if (event.type === "reasoning") {
        if (!reasoning) { reasoning = folded("reasoning", ""); answer.prepend(reasoning); }
        reasoning.querySelector("pre").textContent += event.text;
      } else if (event.type === "tool_call") {
        answer.insertBefore(folded(`tool call: ${event.name}`, JSON.stringify(event.arguments)), body);
      } else if (event.type === "approve") {
        answer.insertBefore(approval(id, event), body);
      } else if (event.type === "end") {
        loaded();
        ended = event;
      } else if (event.type === "error") {
        say(event.message);
      }
    }
  }
  loaded();
  return ended;
}

function approval(id, event) {
  const box = node("div", { className: "approval", "data-testid": "approval" },
                   node("span", { text: `run ${event.name}(${JSON.stringify(event.arguments)})? ` }));
  for (const decision of ["approve", "deny", "always"]) {
    const button = node("button", { type: "button", text: decision, "data-testid": `tool-${decision}` });
    button.addEventListener("click", async () => {
      box.querySelectorAll("button").forEach((b) => { b.disabled = true; });
      await json("POST", `/api/chats/${encodeURIComponent(id)}/approval`, { decision }).catch((e) => say(e.message));
    });
    box.append(button);
  }
  return box;
}

function busy(on) {
  state.busy = on;
  $("send").hidden = on;
  $("stop").hidden = !on;
  $("composer").disabled = on;
  for (const id of ["retry", "undo", "edit"]) $(id).disabled = on;
}

// --- the controls --------------------------------------------------------------------------------

async function patch(fields) {
  Object.assign(state.local, fields);
  if (!state.chat) return;
  try {
    show(await json("PATCH", `/api/chats/${encodeURIComponent(state.chat.id)}`, fields));
  } catch (error) {
    say(error.message);
  }
}

function addPicture(file) {
  if (!file || !file.type.startsWith("image/")) return;
  const reader = new FileReader();
  reader.onload = () => {
    state.pictures.push({ name: file.name, url: reader.result });
    $("attached").append(node("img", { src: reader.result, alt: file.name, className: "thumb" }));
  };
  reader.readAsDataURL(file);
}

async function loadResults() {
  const names = await json("GET", "/api/results").catch(() => []);
  if (!names.length) return;
  $("results-box").hidden = false;
  for (const name of names) {
    const response = await api("GET", `/api/results/${encodeURIComponent(name)}`);
    if (!response.ok) continue;
    const url = URL.createObjectURL(await response.blob());
    $("results").append(node("figure", {}, node("img", { src: url, alt: name }), node("figcaption", { text: name })));
  }
}

function wire() {
  $("composer-form").addEventListener("submit", (e) => { e.preventDefault(); send(state.mode); });
  $("composer").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(state.mode); }
  });
  $("composer").addEventListener("paste", (e) => {
    if ($("attach-label").hidden) return;
    for (const item of e.clipboardData?.files || []) addPicture(item);
  });
  document.addEventListener("dragover", (e) => e.preventDefault());
  document.addEventListener("drop", (e) => {
    e.preventDefault();
    if (!$("attach-label").hidden) for (const f of e.dataTransfer?.files || []) addPicture(f);
  });
  $("attach").addEventListener("change", (e) => { for (const f of e.target.files) addPicture(f); e.target.value = ""; });
  $("stop").addEventListener("click", () => {
    if (state.chat) json("POST", `/api/chats/${encodeURIComponent(state.chat.id)}/stop`).catch((e) => say(e.message));
  });
  $("retry").addEventListener("click", () => send("retry"));
  $("edit").addEventListener("click", () => {
    const turns = state.chat?.turns || [];
    if (!turns.length) return say("nothing to edit yet");
    $("composer").value = turns[turns.length - 1].user;
    state.mode = "edit";
    $("send").textContent = "Resend";
    $("composer").focus();
  });
  $("undo").addEventListener("click", async () => {
    if (!state.chat) return;
    try { show(await json("POST", `/api/chats/${encodeURIComponent(state.chat.id)}/undo`)); } catch (e) { say(e.message); }
  });
  $("new-chat").addEventListener("click", () => {
    state.chat = null;
    location.hash = "";
    document.body.classList.remove("side-open");
    $("messages").replaceChildren();
    say("");
    loadList().catch(() => {});
  });
  $("history").addEventListener("change", () => patch({ history: $("history").checked }));
  $("temperature").addEventListener("change", () => patch({ temperature: Number($("temperature").value) }));
  $("system-save").addEventListener("click", () => patch({ system: $("system").value }));
  // the open conversation goes on with the model picked (the log keeps which model said what)
  $("model").addEventListener("change", () => { showAttach(); if (state.chat) patch({ model: $("model").value }); });
  let typing;
  $("search").addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(() => loadList(), 250); });
  $("menu").addEventListener("click", () => document.body.classList.add("side-open"));
  $("menu-close").addEventListener("click", () => document.body.classList.remove("side-open"));
  document.addEventListener("visibilitychange", () => {
    // back in view: what a terminal or another tab kept meanwhile is shown (never over a turn in progress)
    if (document.visibilityState === "visible" && state.chat && !state.busy) openChat(state.chat.id);
  });
  window.addEventListener("hashchange", () => {
    const id = decodeURIComponent(location.hash.slice(1));
    if (id && id !== state.chat?.id) openChat(id);
  });
}

async function start() {
  wire();
  // what the boxes hold now is shown, not typed: the first conversation's own values replace it
  for (const field of [$("system"), $("temperature")]) field.dataset.shown = field.value;
  try {
    await loadModels();
    await loadList();
    if (location.hash.length > 1) await openChat(decodeURIComponent(location.hash.slice(1)));
    await loadResults();
  } catch (error) {
    say(error.message);
  }
}

document.addEventListener("DOMContentLoaded", start);
