// Baton's web UI: the runs, a run (its graph, a live timeline, cost per level, its output),
// the approvals inbox and the scenarios. Plain JavaScript, no build step. Everything a run
// holds is put on the page as text (textContent, DOM nodes), never as markup.
'use strict';

const main = () => document.getElementById('main');
let leave = []; // what the current view must stop when another is shown

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) {
    if (c == null) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function svg(tag, attrs, ...children) {
  const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v != null) e.setAttribute(k, v);
  for (const c of children.flat()) if (c != null) e.append(c instanceof Node ? c : String(c));
  return e;
}

class Unauthorized extends Error {}

async function api(method, path, body, contentType) {
  const opts = { method, headers: {}, credentials: 'same-origin' };
  if (body !== undefined) {
    opts.headers['content-type'] = contentType || 'application/json';
    opts.body = contentType ? body : JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = text; }
  if (r.status === 401) { location.hash = '#/login'; throw new Unauthorized(data && data.detail); }
  if (!r.ok) throw new Error((data && data.detail) || `${r.status} ${r.statusText}`);
  return data;
}

function money(x) { return '$' + (x || 0).toFixed(4); }
function ms(x) {
  if (x == null) return '';
  if (x < 1000) return `${x} ms`;
  if (x < 60000) return `${(x / 1000).toFixed(1)} s`;
  return `${Math.floor(x / 60000)} min ${Math.floor((x % 60000) / 1000)} s`;
}
function statusEl(s) { return el('span', { class: `status status-${s}` }, s); }
function shortId(id) { return id ? id.slice(0, 8) : ''; }
function problem(e) { return el('p', { class: 'error' }, String(e.message || e)); }

// ---- Markdown, to DOM nodes (headings, lists, code blocks, paragraphs, **, *, `) ----

function inline(text) {
  const out = [];
  const re = /(\*\*[^*]+\*\*|\*[^*\s][^*]*\*|`[^`]+`)/g;
  let last = 0;
  for (const m of text.matchAll(re)) {
    if (m.index > last) out.push(text.slice(last, m.index));
    const t = m[0];
    if (t.startsWith('**')) out.push(el('strong', {}, t.slice(2, -2)));
    else if (t.startsWith('`')) out.push(el('code', {}, t.slice(1, -1)));
    else out.push(el('em', {}, t.slice(1, -1)));
    last = m.index + t.length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

function markdown(text) {
  const root = el('div', { class: 'output' });
  const lines = String(text).split('\n');
  let list = null; let para = [];
  const flush = () => {
    if (para.length) { root.append(el('p', {}, inline(para.join(' ')))); para = []; }
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    if (line.startsWith('```')) {
      flush();
      const code = [];
      for (i++; i < lines.length && !lines[i].startsWith('```'); i++) code.push(lines[i]);
      root.append(el('pre', {}, el('code', {}, code.join('\n'))));
      continue;
    }
    const h = /^(#{1,6})\s+(.*)$/.exec(line);
    if (h) { flush(); root.append(el(`h${h[1].length}`, {}, inline(h[2]))); continue; }
    const li = /^\s*(?:[-*]|\d+\.)\s+(.*)$/.exec(line);
    if (li) {
      if (para.length) { root.append(el('p', {}, inline(para.join(' ')))); para = []; }
      if (!list) { list = el(/^\s*\d/.test(line) ? 'ol' : 'ul'); root.append(list); }
      list.append(el('li', {}, inline(li[1])));
      continue;
    }
    if (!line.trim()) { flush(); continue; }
    list = null;
    para.push(line);
  }
  flush();
  return root;
}

// ---- The scenario graph, drawn as SVG ----

function drawGraph(detail, marks) {
  const ids = detail.levels_in_order.map((l) => l.id);
  const kinds = Object.fromEntries(detail.levels_in_order.map((l) => [l.id, l.kind]));
  const layer = { [detail.entry]: 0 };
  const queue = [detail.entry];
  while (queue.length) {
    const at = queue.shift();
    for (const e of detail.edges) {
      if (e.from === at && !(e.to in layer)) { layer[e.to] = layer[at] + 1; queue.push(e.to); }
    }
  }
  let deepest = 0;
  for (const id of ids) { if (!(id in layer)) layer[id] = 0; deepest = Math.max(deepest, layer[id]); }
  for (const t of ['__end__', '__fail__']) if (detail.edges.some((e) => e.to === t)) layer[t] = deepest + 1;
  const columns = {};
  for (const id of Object.keys(layer)) (columns[layer[id]] = columns[layer[id]] || []).push(id);
  const W = 150, H = 44, GX = 60, GY = 26;
  const pos = {};
  let rows = 0;
  for (const [c, members] of Object.entries(columns)) {
    members.forEach((id, r) => { pos[id] = { x: 20 + Number(c) * (W + GX), y: 20 + r * (H + GY) }; });
    rows = Math.max(rows, members.length);
  }
  const width = 40 + (deepest + 2) * (W + GX);
  const height = 40 + rows * (H + GY);
  const g = svg('svg', { class: 'graph', viewBox: `0 0 ${width} ${height}`, width, height });
  g.append(svg('defs', {}, svg('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto' }, svg('path', { d: 'M0,0 L10,5 L0,10 z', class: 'arrowhead' }))));
  for (const e of detail.edges) {
    const a = pos[e.from]; const b = pos[e.to];
    if (!a || !b) continue;
    const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2;
    const back = b.x <= a.x;
    const d = back
      ? `M${a.x + W / 2},${a.y + H} C${a.x + W / 2},${a.y + H + 40} ${b.x + W / 2},${b.y + H + 40} ${b.x + W / 2},${b.y + H}`
      : `M${x1},${y1} C${x1 + GX / 2},${y1} ${x2 - GX / 2},${y2} ${x2},${y2}`;
    const taken = marks && marks.taken.has(`${e.from}>${e.to}`);
    g.append(svg('path', { d, class: taken ? 'taken' : null, 'marker-end': 'url(#arrow)' }, svg('title', {}, e.when ? `when ${e.when}` : 'always')));
  }
  for (const [id, p] of Object.entries(pos)) {
    const cls = [];
    if (id.startsWith('__')) cls.push('terminal');
    if (marks && marks.visited.has(id)) cls.push('visited');
    if (marks && marks.current === id) cls.push('current');
    const node = svg('g', { class: cls.join(' ') || null, 'data-level': id });
    node.append(svg('rect', { x: p.x, y: p.y, width: W, height: H, rx: 6 }));
    node.append(svg('text', { x: p.x + 10, y: p.y + 19 }, id));
    node.append(svg('text', { x: p.x + 10, y: p.y + 35, class: 'kind' }, kinds[id] || (id === '__end__' ? 'completed' : 'failed')));
    g.append(node);
  }
  return g;
}

// ---- Views ----

function setNav(which) {
  for (const a of document.querySelectorAll('header nav a')) a.classList.toggle('active', a.id === `nav-${which}`);
}

function loginView() {
  setNav('');
  const input = el('input', { id: 'token', type: 'password', placeholder: 'baton_…', size: 60, autocomplete: 'off' });
  const err = el('p', { class: 'error', id: 'login-error' });
  const form = el('form', {
    class: 'card',
    onsubmit: async (ev) => {
      ev.preventDefault();
      err.textContent = '';
      const r = await fetch('/session', { method: 'POST', credentials: 'same-origin', headers: { authorization: `Bearer ${input.value.trim()}` } });
      if (!r.ok) { const p = await r.json().catch(() => ({})); err.textContent = p.detail || `${r.status}`; return; }
      const who = await r.json();
      showWho(who);
      location.hash = '#/runs';
    },
  }, el('h1', {}, 'Sign in'), el('p', { class: 'muted' }, 'Paste a token made with `baton token create --tenant TENANT`. It is kept in an HttpOnly cookie, never in the page.'), input, ' ', el('button', { id: 'login-button', type: 'submit' }, 'Sign in'), err);
  main().replaceChildren(form);
  input.focus();
}

function showWho(who) {
  const w = document.getElementById('who');
  if (!who || !who.signed_in) { w.textContent = ''; return; }
  w.replaceChildren(`${who.name}${who.tenant ? ` · ${who.tenant}` : ''} · ${who.role} `);
  if (who.auth) {
    w.append(el('button', { class: 'secondary', onclick: async () => { await fetch('/session', { method: 'DELETE', credentials: 'same-origin' }); location.hash = '#/login'; } }, 'Sign out'));
  }
}

async function runsView() {
  setNav('runs');
  const status = el('select', { id: 'filter-status' }, el('option', { value: '' }, 'any status'),
    ['running', 'paused', 'waiting', 'interrupted', 'completed', 'failed', 'aborted', 'cancelled'].map((s) => el('option', { value: s }, s)));
  const scenario = el('input', { id: 'filter-scenario', placeholder: 'scenario' });
  const roots = el('input', { type: 'checkbox', id: 'filter-roots', checked: true });
  const body = el('tbody');
  const err = el('div');
  const table = el('table', { id: 'runs-table' },
    el('thead', {}, el('tr', {}, ['run', 'status', 'scenario', 'tenant', 'started', 'duration', 'cost', 'tokens', 'waits on'].map((h) => el('th', {}, h)))), body);
  main().replaceChildren(el('h1', {}, 'Runs'), el('div', { class: 'filters' }, status, scenario, el('label', {}, roots, ' jobs only')), err, table);
  const load = async () => {
    const q = new URLSearchParams({ limit: '100' });
    if (status.value) q.set('status', status.value);
    if (scenario.value.trim()) q.set('scenario', scenario.value.trim());
    if (roots.checked) q.set('roots', 'true');
    try {
      const page = await api('GET', `/runs?${q}`);
      err.replaceChildren();
      body.replaceChildren(...page.runs.map((r) => el('tr', { 'data-run': r.run_id },
        el('td', {}, el('a', { href: `#/runs/${r.run_id}` }, shortId(r.run_id))),
        el('td', {}, statusEl(r.status)),
        el('td', {}, r.scenario_id),
        el('td', {}, r.tenant || ''),
        el('td', {}, new Date(r.created_at).toLocaleString()),
        el('td', { class: 'num' }, ms(r.duration_ms)),
        el('td', { class: 'num' }, money(r.cost_usd)),
        el('td', { class: 'num' }, r.tokens),
        el('td', {}, r.waiting_on.map((w) => `${w.level_id} (${w.for})`).join(', ')))));
    } catch (e) { if (!(e instanceof Unauthorized)) err.replaceChildren(problem(e)); }
  };
  for (const f of [status, scenario, roots]) f.addEventListener('change', load);
  await load();
  const timer = setInterval(load, 2000);
  leave.push(() => clearInterval(timer));
}

function describe(e) {
  const d = e.data || {};
  switch (e.kind) {
    case 'scenario_started': return `started ${d.scenario_id} v${d.scenario_version}`;
    case 'level_started': return `▶ ${e.level_id} (${d.kind}) attempt ${e.attempt}`;
    case 'level_finished': return `■ ${e.level_id} ${d.ok ? 'ok' : 'failed'}${d.verdict ? ` ${d.verdict}` : ''} · ${money(d.cost_usd)} · ${d.tokens} tokens · ${ms(d.duration_ms)}${d.error ? ` · ${d.error}` : ''}`;
    case 'prompt_sent': return `prompt (${d.template}, call ${d.call})`;
    case 'model_response': return `model ${d.provider}/${d.model}: ${d.usage.input_tokens}+${d.usage.output_tokens} tokens · ${money(d.cost_usd)}`;
    case 'model_call_failed': return `model call failed: ${d.message}`;
    case 'tool_call': return `tool ${d.tool} ${JSON.stringify(d.arguments).slice(0, 160)}`;
    case 'tool_result': return `tool ${d.tool} ${d.is_error ? 'error' : 'done'}: ${String(d.content).slice(0, 160)}`;
    case 'verifier_finished': return `verifier ${d.name}: ${d.passed ? 'passed' : 'failed'}${d.reasons && d.reasons.length ? ` — ${d.reasons.join('; ')}` : ''}`;
    case 'gate_decision': return `gate ${d.source} → ${d.target}${d.expression ? `: ${d.expression}` : ''}${(d.readings || []).length ? `  [${d.readings.map((r) => `${r.path}=${JSON.stringify(r.value)}`).join(', ')}]` : ''}`;
    case 'budget_consumed': return `budget: ${money(d.total_cost_usd)} · ${d.total_tokens} tokens`;
    case 'approval_requested': return `waits for approval (${d.approver_role}): ${d.question}`;
    case 'approval_decided': return `${d.approved ? 'approved' : 'rejected'} by ${d.by || 'nobody'}${d.timed_out ? ' (timed out)' : ''}${d.comment ? `: ${d.comment}` : ''}`;
    case 'ask_user': return `asks: ${typeof d.question === 'string' ? d.question : JSON.stringify(d.question)}`;
    case 'user_answered': return `answered: ${JSON.stringify(d.answer)}`;
    case 'child_run_started': return `started child run ${shortId(d.child_run_id)} (${d.scenario_id})`;
    case 'child_run_settled': return `child run ${shortId(d.child_run_id)} settled: ${d.status}`;
    case 'cancel_requested': return `cancel requested${d.by ? ` by ${d.by}` : ''}${d.reason ? `: ${d.reason}` : ''}`;
    case 'run_interrupted': return `interrupted (${d.cause}): ${d.reason}`;
    case 'scenario_finished': return `finished ${d.status}${d.aborted_reason ? ` (${d.aborted_reason})` : ''} · ${money(d.totals && d.totals.cost_usd)}`;
    default: return e.kind.replace(/_/g, ' ');
  }
}

async function runView(id) {
  setNav('runs');
  let run; let detail;
  try {
    run = await api('GET', `/runs/${id}`);
    detail = await api('GET', `/scenarios/${run.scenario_id}`).catch(() => null);
  } catch (e) { if (!(e instanceof Unauthorized)) main().replaceChildren(problem(e)); return; }
  const head = el('div');
  const graphBox = el('div', { id: 'graph' });
  const costs = el('tbody');
  const progress = el('p', { class: 'progress', id: 'progress' });
  const timeline = el('ul', { class: 'timeline', id: 'timeline' });
  const output = el('div', { id: 'output' });
  const children = el('ul', { id: 'children' });
  main().replaceChildren(head,
    el('div', { class: 'row' },
      el('div', { class: 'col' }, el('h2', {}, 'Graph'), graphBox, el('h2', {}, 'Cost per level'),
        el('table', {}, el('thead', {}, el('tr', {}, ['level', 'attempts', 'cost', 'tokens', 'time'].map((h) => el('th', {}, h)))), costs),
        el('h2', {}, 'Runs it started'), children),
      el('div', { class: 'col' }, el('h2', {}, 'Timeline'), progress, timeline)),
    el('h2', {}, 'Output'), output);
  const marks = { visited: new Set(), current: null, taken: new Set() };
  const perLevel = {};
  const renderHead = () => {
    head.replaceChildren(...[el('h1', {}, `Run ${shortId(run.run_id)} · ${run.scenario_id} · `, statusEl(run.status)),
      el('p', { class: 'muted' }, `${run.run_id} · ${money(run.cost_usd)} · ${run.tokens} tokens · ${ms(run.duration_ms)}${run.reason ? ` · ${run.reason}` : ''}`),
      ['completed', 'failed', 'aborted', 'cancelled'].includes(run.status) ? null
        : el('button', { class: 'danger', id: 'cancel', onclick: async () => {
          try { run = await api('POST', `/runs/${id}/cancel`, { reason: 'cancelled from the web UI' }); renderHead(); } catch (e) { head.append(problem(e)); }
        } }, 'Cancel')].filter(Boolean));
    output.replaceChildren(run.output ? markdown(run.output) : el('p', { class: 'muted' }, 'No output yet.'));
    children.replaceChildren(...run.children.map((c) => el('li', {}, el('a', { href: `#/runs/${c}` }, c))));
  };
  const renderGraph = () => { if (detail) graphBox.replaceChildren(drawGraph(detail, marks)); };
  const renderCosts = () => costs.replaceChildren(...Object.entries(perLevel).map(([lvl, t]) => el('tr', {},
    el('td', {}, lvl), el('td', { class: 'num' }, t.attempts), el('td', { class: 'num' }, money(t.cost)), el('td', { class: 'num' }, t.tokens), el('td', { class: 'num' }, ms(t.ms)))));
  renderHead(); renderGraph();
  const source = new EventSource(`/runs/${id}/events?tree=true`);
  leave.push(() => source.close());
  const onEvent = async (msg) => {
    const e = JSON.parse(msg.data);
    const mine = e.run_id === id;
    if (e.kind === 'heartbeat') {
      progress.textContent = `working ${ms(e.data.elapsed_ms)} · ${e.data.streamed_bytes} bytes streamed · ${e.data.tool_calls} tool calls`;
      return;
    }
    progress.textContent = '';
    timeline.append(el('li', { class: `ev-${e.kind}${e.kind.endsWith('_finished') && e.data && (e.data.ok === false || e.data.passed === false) ? ' failed' : ''}`, 'data-seq': e.seq },
      mine ? null : el('span', { class: 'run' }, shortId(e.run_id)), el('span', { class: 'seq' }, `#${e.seq}`), describe(e)));
    timeline.scrollTop = timeline.scrollHeight;
    if (!mine) return;
    if (e.kind === 'level_started') { marks.visited.add(e.level_id); marks.current = e.level_id; renderGraph(); }
    if (e.kind === 'gate_decision') { marks.taken.add(`${e.data.source}>${e.data.target}`); renderGraph(); }
    if (e.kind === 'level_finished') {
      const t = perLevel[e.level_id] = perLevel[e.level_id] || { attempts: 0, cost: 0, tokens: 0, ms: 0 };
      t.attempts += 1; t.cost += e.data.cost_usd; t.tokens += e.data.tokens; t.ms += e.data.duration_ms;
      renderCosts();
    }
    if (['level_finished', 'approval_requested', 'approval_decided', 'scenario_finished', 'child_run_started', 'budget_consumed', 'cancel_requested', 'run_interrupted'].includes(e.kind)) {
      try { run = await api('GET', `/runs/${id}`); } catch { /* the next event tries again */ }
      if (e.kind === 'scenario_finished') { marks.current = null; renderGraph(); }
      renderHead();
    }
  };
  // The text of model answers as it streams in, shown under the timeline until the answer
  // is logged.
  const streaming = {};
  let deltas = 0;
  source.addEventListener('model_delta', (msg) => {
    const t = JSON.parse(msg.data);
    const key = `${t.run_id}|${t.level_id}|${t.call}`;
    streaming[key] = (streaming[key] || '') + t.text;
    deltas += 1;
    timeline.dataset.deltas = String(deltas);
    progress.textContent = `${t.run_id === id ? '' : `${shortId(t.run_id)} `}${t.level_id} ▸ ${streaming[key].slice(-300)}`;
  });
  source.onmessage = onEvent;
  for (const kind of ['scenario_started', 'scenario_selected', 'level_started', 'level_finished', 'prompt_sent', 'model_response', 'model_call_failed', 'tool_call', 'tool_result', 'verifier_started', 'verifier_finished', 'gate_decision', 'budget_consumed', 'approval_requested', 'approval_decided', 'ask_user', 'user_answered', 'child_run_started', 'child_run_settled', 'cancel_requested', 'run_interrupted', 'run_resumed', 'scenario_finished', 'heartbeat', 'warning', 'level_timed_out', 'budget_exceeded', 'scratchpad_written', 'file_created', 'wave_planned', 'wave_dispatched', 'wave_recorded', 'wave_decided', 'provider_retry', 'provider_failover', 'model_call_cut', 'snapshot_taken']) {
    source.addEventListener(kind, onEvent);
  }
}

function schemaForm(schema) {
  // A form for an object schema of simple fields; anything else is a JSON text area.
  const props = schema && schema.type === 'object' && schema.properties;
  const simple = props && Object.values(props).every((p) => ['string', 'boolean', 'number', 'integer'].includes(p.type) || Array.isArray(p.enum));
  if (!simple) {
    const area = el('textarea', { class: 'answer-json', placeholder: 'the answer as JSON' });
    return { node: area, value: () => JSON.parse(area.value) };
  }
  const fields = {};
  const node = el('div', {}, Object.entries(props).map(([name, p]) => {
    let input;
    if (Array.isArray(p.enum)) input = el('select', { name }, p.enum.map((v) => el('option', { value: JSON.stringify(v) }, String(v))));
    else if (p.type === 'boolean') input = el('input', { type: 'checkbox', name });
    else input = el('input', { name, type: p.type === 'string' ? 'text' : 'number', step: p.type === 'integer' ? '1' : 'any' });
    fields[name] = { input, p };
    return el('p', {}, el('label', {}, `${name}${(schema.required || []).includes(name) ? ' *' : ''} `, input));
  }));
  return {
    node,
    value: () => Object.fromEntries(Object.entries(fields).filter(([, f]) => f.p.type === 'boolean' || f.input.value !== '').map(([k, f]) => {
      if (Array.isArray(f.p.enum)) return [k, JSON.parse(f.input.value)];
      if (f.p.type === 'boolean') return [k, f.input.checked];
      if (f.p.type === 'string') return [k, f.input.value];
      return [k, Number(f.input.value)];
    })),
  };
}

async function inboxView() {
  setNav('inbox');
  const list = el('div', { id: 'inbox' });
  main().replaceChildren(el('h1', {}, 'Approvals and questions'), list);
  const load = async () => {
    let page;
    try { page = await api('GET', '/runs?status=paused&limit=200'); } catch (e) { if (!(e instanceof Unauthorized)) list.replaceChildren(problem(e)); return; }
    if (list.querySelector('textarea:focus, input:focus')) return; // never under the approver's hands
    const cards = [];
    for (const r of page.runs) {
      for (const w of r.waiting_on.filter((x) => x.for === 'approval' || x.for === 'answer')) {
        const err = el('p', { class: 'error' });
        const act = async (path, body) => {
          try { await api('POST', `/runs/${r.run_id}/${path}`, body); await load(); } catch (e) { err.textContent = String(e.message || e); }
        };
        let controls;
        if (w.for === 'approval') {
          const comment = el('textarea', { class: 'comment', placeholder: 'comment (optional)' });
          // The level's output_schema asks the approver for data beyond the decision.
          const props = Object.fromEntries(Object.entries((w.schema && w.schema.properties) || {}).filter(([k]) => k !== 'approved' && k !== 'comment'));
          const extra = Object.keys(props).length
            ? schemaForm({ type: 'object', properties: props, required: ((w.schema && w.schema.required) || []).filter((k) => k in props) })
            : null;
          const decide = (path) => {
            let data = null;
            if (extra) { try { data = extra.value(); } catch (e) { err.textContent = `not JSON: ${e.message}`; return; } }
            act(path, { request_id: w.request_id, comment: comment.value || null, data });
          };
          controls = el('div', {}, extra ? extra.node : null, comment,
            el('button', { class: 'approve', onclick: () => decide('approve') }, 'Approve'), ' ',
            el('button', { class: 'reject secondary', onclick: () => decide('reject') }, 'Reject'));
        } else {
          const form = schemaForm(w.schema);
          controls = el('div', {}, form.node, el('button', { class: 'answer', onclick: () => {
            let value; try { value = form.value(); } catch (e) { err.textContent = `not JSON: ${e.message}`; return; }
            act('answer', { answer: value });
          } }, 'Answer'));
        }
        cards.push(el('div', { class: 'card', 'data-run': r.run_id, 'data-request': w.request_id || '' },
          el('h2', {}, el('a', { href: `#/runs/${r.run_id}` }, `${r.scenario_id} · ${shortId(r.run_id)}`), ` · ${w.level_id} · ${w.for}`),
          el('p', { class: 'muted' }, `${money(r.cost_usd)} spent · ${r.tokens} tokens${w.deadline ? ` · decide before ${new Date(w.deadline).toLocaleString()}` : ''}`),
          el('pre', {}, typeof w.question === 'string' ? w.question
            : (w.question && typeof w.question.question === 'string') ? w.question.question : JSON.stringify(w.question, null, 2)),
          controls, err));
      }
    }
    list.replaceChildren(...(cards.length ? cards : [el('p', { class: 'muted', id: 'inbox-empty' }, 'Nothing waits for you.')]));
  };
  await load();
  const timer = setInterval(load, 2000);
  leave.push(() => clearInterval(timer));
}

async function scenariosView() {
  setNav('scenarios');
  let list;
  try { list = await api('GET', '/scenarios'); } catch (e) { if (!(e instanceof Unauthorized)) main().replaceChildren(problem(e)); return; }
  const yaml = el('textarea', { id: 'validate-yaml', placeholder: 'paste a scenario file (YAML) to check it', rows: 10 });
  const result = el('div', { id: 'validate-result' });
  main().replaceChildren(el('h1', {}, 'Scenarios'),
    el('table', { id: 'scenarios-table' }, el('thead', {}, el('tr', {}, ['scenario', 'version', 'levels', 'routes', 'description'].map((h) => el('th', {}, h)))),
      el('tbody', {}, list.map((s) => el('tr', {}, el('td', {}, el('a', { href: `#/scenarios/${s.id}` }, s.id)), el('td', { class: 'num' }, s.version), el('td', { class: 'num' }, s.levels), el('td', {}, s.intent_routes.join(', ')), el('td', {}, s.description))))),
    el('h2', {}, 'Validate a file'), yaml,
    el('p', {}, el('button', { id: 'validate', onclick: async () => {
      try {
        const v = await api('POST', '/scenarios/validate', yaml.value, 'application/yaml');
        result.replaceChildren(el('p', { class: v.ok ? 'status-completed' : 'status-failed' }, v.ok ? `valid: ${v.scenario_id}` : 'not valid'),
          ...v.diagnostics.map((d) => el('div', { class: `diag ${d.severity}` }, `${d.severity} ${d.code} ${d.file}:${d.line}:${d.column}: ${d.message}${d.help ? ` — ${d.help}` : ''}`)));
      } catch (e) { result.replaceChildren(problem(e)); }
    } }, 'Validate')), result);
}

async function scenarioView(id) {
  setNav('scenarios');
  let d;
  try { d = await api('GET', `/scenarios/${id}`); } catch (e) { if (!(e instanceof Unauthorized)) main().replaceChildren(problem(e)); return; }
  main().replaceChildren(el('h1', {}, `${d.display_name || d.id} · v${d.version}`), el('p', {}, d.description),
    drawGraph(d, null),
    el('h2', {}, 'Edges'),
    el('table', {}, el('tbody', {}, d.edges.map((e) => el('tr', {}, el('td', {}, e.from), el('td', {}, '→'), el('td', {}, e.to), el('td', {}, el('code', {}, e.when || 'always')))))),
    el('p', { class: 'muted' }, `checksum ${d.checksum}`));
}

async function route() {
  for (const stop of leave) stop();
  leave = [];
  const parts = (location.hash.replace(/^#\/?/, '') || 'runs').split('/');
  try {
    if (parts[0] === 'login') return loginView();
    if (parts[0] === 'runs' && parts[1]) return await runView(decodeURIComponent(parts[1]));
    if (parts[0] === 'inbox') return await inboxView();
    if (parts[0] === 'scenarios' && parts[1]) return await scenarioView(decodeURIComponent(parts[1]));
    if (parts[0] === 'scenarios') return await scenariosView();
    return await runsView();
  } catch (e) {
    if (!(e instanceof Unauthorized)) main().replaceChildren(problem(e));
  }
}

window.addEventListener('hashchange', route);
window.addEventListener('DOMContentLoaded', async () => {
  const r = await fetch('/session', { credentials: 'same-origin' }).catch(() => null);
  const who = r && r.ok ? await r.json() : null;
  if (who && who.signed_in) showWho(who);
  else if (who && !location.hash.startsWith('#/login')) location.hash = '#/login';
  route();
});
