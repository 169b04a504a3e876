// Markdown to DOM nodes, never to HTML: every piece of text becomes a text node, so nothing a
// model, a tool, a file or a user wrote can run as markup or script. Blocks: fenced code,
// headings, lists, quotes, paragraphs; inline: code, bold, italic, links (http, https, mailto only,
// opened apart with rel="noopener noreferrer").
"use strict";

(function () {
  const SAFE_LINK = /^(https?:|mailto:)/i;

  function el(tag, ...children) {
    const node = document.createElement(tag);
    for (const child of children) node.append(child);
    return node;
  }

  function inline(text) {
    const out = document.createDocumentFragment();
    const pattern = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([^*]+)\*\*|__([^_]+)__|\*([^*\s][^*]*)\*|_([^_\s][^_]*)_|\[([^\]]+)\]\(([^)\s]+)\)/g;
    let last = 0;
    for (const m of text.matchAll(pattern)) {
      if (m.index > last) out.append(document.createTextNode(text.slice(last, m.index)));
      if (m[2] !== undefined) out.append(el("code", m[2]));
      else if (m[3] !== undefined || m[4] !== undefined) out.append(el("strong", inline(m[3] ?? m[4])));
      else if (m[5] !== undefined || m[6] !== undefined) out.append(el("em", inline(m[5] ?? m[6])));
      else out.append(link(m[7], m[8]));
      last = m.index + m[0].length;
    }
    if (last < text.length) out.append(document.createTextNode(text.slice(last)));
    return out;
  }

  function link(label, href) {
    if (!SAFE_LINK.test(href)) return document.createTextNode(`[${label}](${href})`);
    const a = el("a", inline(label));
    a.href = href;
    a.rel = "noopener noreferrer";
    a.target = "_blank";
    return a;
  }

  function render(text) {
    const root = document.createDocumentFragment();
    const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      const fence = line.match(/^\s*(```|~~~)\s*([\w+-]*)\s*$/);
      if (fence) {
        const body = [];
        i += 1;
        while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
        i += 1;
        const code = el("code", body.join("\n"));
        if (fence[2]) code.dataset.lang = fence[2];
        root.append(el("pre", code));
        continue;
      }
      const heading = line.match(/^(#{1,6})\s+(.*)$/);
      if (heading) {
        root.append(el(`h${Math.min(6, heading[1].length + 2)}`, inline(heading[2])));
        i += 1;
        continue;
      }
      if (/^\s*([-*+]|\d+[.)])\s+/.test(line)) {
        const ordered = /^\s*\d+[.)]\s+/.test(line);
        const list = el(ordered ? "ol" : "ul");
        while (i < lines.length && /^\s*([-*+]|\d+[.)])\s+/.test(lines[i])) {
          list.append(el("li", inline(lines[i].replace(/^\s*([-*+]|\d+[.)])\s+/, ""))));
          i += 1;
        }
        root.append(list);
        continue;
      }
      if (/^\s*>/.test(line)) {
        const quoted = [];
        while (i < lines.length && /^\s*>/.test(lines[i])) quoted.push(lines[i++].replace(/^\s*>\s?/, ""));
        root.append(el("blockquote", render(quoted.join("\n"))));
        continue;
      }
      if (!line.trim()) {
        i += 1;
        continue;
      }
      const para = [lines[i++]];  // (at least this line: nothing above took it)
      while (i < lines.length && lines[i].trim() && !/^\s*(```|~~~|#{1,6}\s|>|[-*+]\s|\d+[.)]\s)/.test(lines[i])) {
        para.push(lines[i++]);
      }
      const p = el("p");
      para.forEach((part, n) => {
        if (n) p.append(el("br"));
        p.append(inline(part));
      });
      root.append(p);
    }
    return root;
  }

  window.renderMarkdown = render;
})();
