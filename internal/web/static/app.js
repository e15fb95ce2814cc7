// seckill's shop page. Plain JavaScript, no build step, no inline script
// (the page's CSP forbids it). Every text from the server goes into the
// page through textContent, never as markup. URLs are relative, so the page
// works at any path behind a proxy.
(function () {
  "use strict";

  var API = new URL("api/v1/", document.baseURI).toString();
  var SESSION_KEY = "seckill.session";
  var LIST_EVERY_MS = 2000;
  var ORDER_EVERY_MS = 500;
  var ORDER_GIVE_UP_MS = 60000;
  // Once an order's payment time is up the page asks for it again, this
  // often, until the server says what became of it (or gives up after a
  // while: My orders still tells).
  var DUE_ASK_EVERY_MS = 2000;
  var DUE_GIVE_UP_MS = 120000;
  // An order paid on a gateway's page is asked for this often meanwhile.
  var GATEWAY_ASK_EVERY_MS = 3000;
  // After a draw's close its small status is asked for this often until
  // done (the answer's ETag sent back: unchanged, it is a 304 without a
  // body); then the buyer's own entry, once. The whole list is never
  // downloaded: the card links it, a page at a time.
  var DRAW_ASK_EVERY_MS = 500;
  var DRAWS_KEY = "seckill.draws."; // + user id: voucher id -> entry

  var $ = function (id) { return document.getElementById(id); };
  var state = {
    session: loadSession(),
    vouchers: [],      // as the server listed them
    cards: new Map(),  // voucher id -> card elements
    skewMs: 0,         // server clock minus ours
    mine: new Map(),   // voucher id -> {order, status, at} the buyer holds (a live or pending order)
    orders: new Map(), // order id -> {view, dueAt, askedAt, payUrl, busy} of orders this page knows
    list: [],          // order ids of My orders, as listed
    // voucher id -> {ticket, closes, nonce, commitment, result, place,
    // count, check, hash} of draws the buyer entered: commitment is the
    // one the page showed at the entry, check what the published secret
    // made of it (verified or mismatch, hash its SHA-256).
    draws: new Map(),
    following: new Set(), // voucher ids whose draw result is being asked for
    listTimer: 0,
    polls: 0,
  };

  // ---- session ---------------------------------------------------------

  function loadSession() {
    try {
      var s = JSON.parse(localStorage.getItem(SESSION_KEY) || "null");
      if (s && s.token && Date.parse(s.expires_at) > Date.now()) { return s; }
    } catch (e) { /* a broken entry is no session */ }
    localStorage.removeItem(SESSION_KEY);
    return null;
  }

  function saveSession(s) {
    state.session = s;
    if (s) { localStorage.setItem(SESSION_KEY, JSON.stringify(s)); } else { localStorage.removeItem(SESSION_KEY); }
    renderSession();
  }

  function renderSession() {
    var s = state.session;
    $("login-panel").hidden = !!s;
    $("logout").hidden = !s;
    $("who").textContent = s ? ((s.phone || ("user " + s.user_id)) + (s.role === "admin" ? " · admin" : "")) : "";
    $("orders-panel").hidden = !s;
    $("console-link").hidden = !(s && s.role === "admin");
    state.mine = new Map(); // the previous user's
    state.orders = new Map();
    state.list = [];
    state.draws = loadDraws(s);
    state.following = new Set();
    say($("orders-msg"), "", "");
    if (s) { loadOrders(); } else { $("orders").replaceChildren(); }
    // Messages on the cards belong to the previous user.
    state.cards.forEach(function (c) {
      say(c.msg, "", "");
      delete c.msg.dataset.code;
      delete c.msg.dataset.status;
      delete c.msg.dataset.order;
      delete c.msg.dataset.seen;
    });
    renderCards();
    state.draws.forEach(function (e, id) { if (!e.result) { followDraw(id); } });
  }

  // loadDraws reads the draws the session's buyer entered on this device.
  function loadDraws(s) {
    var m = new Map();
    if (!s) { return m; }
    try {
      var o = JSON.parse(localStorage.getItem(DRAWS_KEY + s.user_id) || "{}");
      Object.keys(o).forEach(function (id) { if (o[id] && o[id].ticket) { m.set(Number(id), o[id]); } });
    } catch (e) { /* a broken entry is no entry */ }
    return m;
  }

  function saveDraws() {
    var s = state.session;
    if (!s) { return; }
    var o = {};
    state.draws.forEach(function (e, id) { o[id] = e; });
    localStorage.setItem(DRAWS_KEY + s.user_id, JSON.stringify(o));
  }

  // ---- talking to the API ---------------------------------------------

  // call sends a request and resolves to {status, body, retryAfter}; a
  // network failure resolves to status 0. token, when given, is sent
  // instead of the session's; extra headers are added.
  function call(method, path, body, token, extra) {
    var headers = { "Accept": "application/json" };
    Object.keys(extra || {}).forEach(function (k) { headers[k] = extra[k]; });
    if (body !== undefined) { headers["Content-Type"] = "application/json"; }
    var bearer = token || (state.session && state.session.token);
    if (bearer) { headers["Authorization"] = "Bearer " + bearer; }
    var sent = Date.now();
    return fetch(API + path, {
      method: method, headers: headers, cache: "no-store", credentials: "omit",
      body: body === undefined ? undefined : JSON.stringify(body),
    }).then(function (resp) {
      noteClock(resp, sent);
      return resp.json().catch(function () { return {}; }).then(function (b) {
        var r = { status: resp.status, body: b || {}, retryAfter: parseInt(resp.headers.get("Retry-After") || "0", 10), at: Date.now(),
          etag: resp.headers.get("ETag") || "" };
        if (r.status === 401 && state.session && !token && path.indexOf("auth/") !== 0) {
          saveSession(null);
          notice("Your session ended; please log in again.", "bad");
        }
        return r;
      });
    }, function () {
      return { status: 0, body: { code: "network", message: "network error" }, retryAfter: 0, at: Date.now() };
    });
  }

  // noteClock estimates the server's clock from its Date header, so the
  // countdowns follow the server, not a phone whose clock is off.
  function noteClock(resp, sent) {
    var d = Date.parse(resp.headers.get("Date") || "");
    if (isNaN(d)) { return; }
    var mid = (sent + Date.now()) / 2;
    var skew = d + 500 - mid; // Date has whole seconds: take the middle
    if (Math.abs(skew - state.skewMs) > 1500) { state.skewMs = skew; }
  }

  function now() { return Date.now() + state.skewMs; }

  var MESSAGES = {
    sold_out: ["Sold out.", "bad"],
    not_started: ["The sale has not started yet.", "warn"],
    ended: ["The sale has ended.", "bad"],
    too_many_requests: ["Too many requests; try again in a moment.", "warn"],
    not_ready: ["The sale is being prepared; try again in a moment.", "warn"],
    unavailable: ["The shop is busy right now; try again in a moment.", "warn"],
    voucher_not_found: ["This voucher no longer exists.", "bad"],
    unauthorized: ["Please log in first.", "warn"],
    network: ["Network error: check your connection and try again.", "bad"],
    order_not_found: ["This order does not exist.", "bad"],
    order_pending: ["The order is still being confirmed; try again in a moment.", "warn"],
    payment_unavailable: ["Payments cannot be taken right now; try again in a moment.", "warn"],
    drawing: ["The draw closed: drawing the winners…", "warn"],
    pow_required: ["Your entry's proof of work was refused; try again.", "bad"],
  };

  function explain(r) {
    var code = r.body.code;
    var m = MESSAGES[code];
    if (code === "too_many_requests" && r.retryAfter > 0) {
      return ["Too many requests; try again in " + r.retryAfter + " s.", "warn"];
    }
    if (m) { return m; }
    if (r.status >= 500 || r.status === 0) { return ["Something went wrong; try again in a moment.", "bad"]; }
    return [r.body.message || ("Error " + r.status), "bad"];
  }

  function say(el, text, kind) {
    el.textContent = text;
    el.className = el.className.replace(/\b(ok|warn|bad)\b/g, "").trim() + (kind ? " " + kind : "");
  }

  function notice(text, kind) {
    var n = $("notice");
    n.textContent = text;
    n.className = "notice" + (kind ? " " + kind : "");
    n.hidden = !text;
  }

  // ---- login --------------------------------------------------------------

  function normalPhone(v) { return v.replace(/[\s\-().]/g, ""); }

  var resendTimer = 0;
  // releaseResend ends the wait for another code: after a login, a logout,
  // or when the phone changes (the wait is per phone on the server too).
  function releaseResend() {
    clearInterval(resendTimer);
    $("send-code").disabled = false;
    $("send-code").textContent = "Send code";
  }
  function holdResend(secs) {
    var btn = $("send-code");
    clearInterval(resendTimer);
    var until = Date.now() + secs * 1000;
    var tick = function () {
      var left = Math.ceil((until - Date.now()) / 1000);
      if (left <= 0) {
        clearInterval(resendTimer);
        btn.disabled = false;
        btn.textContent = "Send code";
        return;
      }
      btn.disabled = true;
      btn.textContent = "Resend in " + left + "s";
    };
    tick();
    resendTimer = setInterval(tick, 500);
  }

  $("code-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    var phone = normalPhone($("phone").value);
    var msg = $("login-msg");
    if (!/^\+[1-9][0-9]{7,14}$/.test(phone)) {
      say(msg, "Enter your phone with its country code, such as +8613800138000.", "bad");
      return;
    }
    $("send-code").disabled = true;
    call("POST", "auth/code", { phone: phone }).then(function (r) {
      if (r.status === 202) {
        say(msg, "Code sent to " + phone + ". It is valid for " + Math.round(r.body.expires_in / 60) + " minutes.", "ok");
        $("login-form").hidden = false;
        $("code").focus();
        heldPhone = phone;
        holdResend(r.body.resend_after || 60);
        return;
      }
      $("send-code").disabled = false;
      var e = explain(r);
      if (r.body.code === "invalid_phone") { e = [r.body.message, "bad"]; }
      say(msg, e[0], e[1]);
      if (r.status === 429 && r.retryAfter > 0) { holdResend(r.retryAfter); }
    });
  });

  $("login-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    var phone = normalPhone($("phone").value);
    var code = $("code").value.trim();
    var msg = $("login-msg");
    if (!/^[0-9]{6}$/.test(code)) {
      say(msg, "The code is 6 digits.", "bad");
      return;
    }
    $("login").disabled = true;
    call("POST", "auth/login", { phone: phone, code: code }).then(function (r) {
      $("login").disabled = false;
      if (r.status === 200) {
        $("code").value = "";
        $("login-form").hidden = true;
        releaseResend();
        say(msg, "", "");
        saveSession({ token: r.body.token, role: r.body.role, user_id: r.body.user_id, expires_at: r.body.expires_at, phone: phone });
        notice("", "");
        return;
      }
      var text;
      switch (r.body.code) {
        case "wrong_code": text = "Wrong code; " + r.body.tries_left + " tries left."; break;
        case "code_expired": text = "That code expired or was used; ask for a new one."; break;
        case "code_locked": text = "Too many wrong codes; ask for a new one."; break;
        default: text = explain(r)[0];
      }
      say(msg, text, "bad");
    });
  });

  $("logout").addEventListener("click", function () {
    saveSession(null);
    releaseResend();
    say($("login-msg"), "", "");
    notice("", "");
  });

  var heldPhone = "";
  $("phone").addEventListener("input", function () {
    if (normalPhone($("phone").value) !== heldPhone) { releaseResend(); }
  });

  // ---- the sale -----------------------------------------------------------

  function money(cents) {
    return "¥" + (cents / 100).toFixed(cents % 100 === 0 ? 0 : 2);
  }

  function span(ms) {
    var s = Math.max(0, Math.floor(ms / 1000));
    var d = Math.floor(s / 86400); s -= d * 86400;
    var h = Math.floor(s / 3600); s -= h * 3600;
    var m = Math.floor(s / 60); s -= m * 60;
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    return (d > 0 ? d + "d " : "") + pad(h) + ":" + pad(m) + ":" + pad(s);
  }

  var DAYS = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
  var MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

  // dateText is an instant in the device's time zone: "Mon 3 Jan 2028, 09:00".
  function dateText(ms) {
    var d = new Date(ms);
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    return DAYS[d.getDay()] + " " + d.getDate() + " " + MONTHS[d.getMonth()] + " " + d.getFullYear() +
      ", " + pad(d.getHours()) + ":" + pad(d.getMinutes());
  }

  // whenText says when a start or an end comes: a countdown within a day, the
  // local date and time beyond it ("Starts in 761d 21:11:44" helps no one).
  function whenText(what, at, t) {
    return at - t > 86400000 ? what + " " + dateText(at) : what + " in " + span(at - t);
  }

  function loadVouchers() {
    return call("GET", "vouchers?limit=50").then(function (r) {
      if (r.status !== 200) {
        var e = explain(r);
        notice("Cannot load the sale: " + e[0], "bad");
        return;
      }
      if ($("notice").textContent.indexOf("Cannot load the sale") === 0) { notice("", ""); }
      var first = !state.loaded;
      state.loaded = true;
      state.vouchers = r.body.vouchers || [];
      renderCards();
      if (first && state.session) { loadOrders(); } // now with titles
    });
  }

  function pollVouchers() {
    clearTimeout(state.listTimer);
    var next = function () { state.listTimer = setTimeout(pollVouchers, LIST_EVERY_MS); };
    if (document.visibilityState === "hidden") { next(); return; }
    loadVouchers().then(next, next);
  }

  function card(v) {
    var c = state.cards.get(v.id);
    if (c) { return c; }
    var li = $("voucher-tpl").content.firstElementChild.cloneNode(true);
    c = {
      li: li, title: li.querySelector(".v-title"), face: li.querySelector(".v-face"), price: li.querySelector(".v-price"),
      bar: li.querySelector(".v-bar span"), left: li.querySelector(".v-left"),
      when: li.querySelector(".v-when"), grab: li.querySelector(".grab"), msg: li.querySelector(".v-msg"),
      code: li.querySelector(".v-code"), codeText: li.querySelector(".code-big"), copy: li.querySelector(".copy"),
      draw: li.querySelector(".v-draw"), what: li.querySelector(".draw-what"), drawResult: li.querySelector(".draw-result"), commit: li.querySelector(".draw-commit"),
      copyCommit: li.querySelector(".copy-commit"), check: li.querySelector(".draw-check"), secret: li.querySelector(".draw-secret"),
      drawMine: li.querySelector(".draw-mine"), drawVerify: li.querySelector(".draw-verify"), drawList: li.querySelector(".draw-list"),
      pay: $("pay-tpl").content.firstElementChild.cloneNode(true), busy: false, holdUntil: 0,
    };
    li.dataset.voucherId = String(v.id);
    c.pay.classList.add("v-pay");
    li.insertBefore(c.pay, c.draw); // the buyer's actions before the draw's small print
    c.grab.addEventListener("click", function () { grab(v.id); });
    c.copy.addEventListener("click", function () { copyCode(c.codeText, c.copy); });
    c.copyCommit.addEventListener("click", function () { copyCode(c.commit, c.copyCommit, c.v.draw ? c.v.draw.commitment : ""); });
    // Pay and Cancel act on the order the buyer holds when pressed.
    c.pay.querySelector(".pay").addEventListener("click", function () {
      var m = state.mine.get(v.id);
      if (m) { pay(m.order, c.msg); }
    });
    c.pay.querySelector(".cancel").addEventListener("click", function () {
      var m = state.mine.get(v.id);
      if (m) { cancel(m.order, c.msg); }
    });
    state.cards.set(v.id, c);
    return c;
  }

  function renderCards() {
    var list = $("vouchers");
    var seen = new Set();
    state.vouchers.forEach(function (v, i) {
      var c = card(v);
      seen.add(v.id);
      if (list.children[i] !== c.li) { list.insertBefore(c.li, list.children[i] || null); }
      c.v = v;
      c.title.textContent = v.title;
      // What the buyer pays is the main figure; what it is worth beside it.
      c.price.textContent = v.price > 0 ? money(v.price) : "Free";
      c.face.textContent = "worth " + money(v.face_value);
      c.price.classList.toggle("free", !(v.price > 0));
      var pct = v.total_stock > 0 ? Math.round(100 * v.stock / v.total_stock) : 0;
      c.bar.style.width = pct + "%";
      c.left.textContent = v.stock + " of " + v.total_stock + " left";
      tickCard(c);
    });
    state.cards.forEach(function (c, id) {
      if (!seen.has(id)) { c.li.remove(); state.cards.delete(id); }
    });
    $("vouchers-empty").hidden = state.vouchers.length > 0;
  }

  // phase is upcoming, on_sale, sold_out or ended, by the server's clock.
  function phase(v) {
    var t = now();
    if (t < Date.parse(v.begin_at)) { return "upcoming"; }
    if (t >= Date.parse(v.end_at)) { return "ended"; }
    if (v.stock <= 0) { return "sold_out"; }
    return "on_sale";
  }

  function tickCard(c) {
    var v = c.v;
    var p = phase(v);
    c.li.className = "voucher " + p.replace("_", "");
    c.li.dataset.phase = p;
    paintDraw(c);
    if (tickDraw(c)) { return; }
    var t = now();
    var label = "Grab";
    switch (p) {
      case "upcoming":
        c.when.textContent = whenText("Starts", Date.parse(v.begin_at), t);
        label = "Not started";
        break;
      case "ended":
        c.when.textContent = "Sale ended";
        label = "Ended";
        break;
      case "sold_out":
        c.when.textContent = whenText("Ends", Date.parse(v.end_at), t);
        label = "Sold out";
        break;
      default:
        c.when.textContent = whenText("Ends", Date.parse(v.end_at), t);
    }
    // A voucher the buyer holds is theirs whatever the sale does next.
    // It is "Yours" only once paid: reserved until then, with the time
    // left to pay.
    var mine = state.session ? state.mine.get(v.id) : undefined;
    var owned = !!mine && (mine.status === "paid" || mine.status === "used");
    c.li.classList.toggle("mine", owned);
    c.li.classList.toggle("reserved", !!mine && !owned);
    c.grab.classList.toggle("yours", owned && !c.busy);
    c.grab.classList.toggle("reserved", !!mine && !owned && !c.busy);
    var waiting = c.holdUntil > Date.now();
    c.grab.disabled = !!mine || p !== "on_sale" || c.busy || waiting;
    c.grab.textContent = c.busy ? "Grabbing…" : owned ? "Yours" : mine ? heldText(mine) :
      (waiting && p === "on_sale" ? "Wait " + Math.ceil((c.holdUntil - Date.now()) / 1000) + "s" : label);
    // Units came back (an order was cancelled or refunded): the refusal
    // the buyer was shown no longer holds.
    if (p === "on_sale" && c.msg.dataset.code === "sold_out") {
      say(c.msg, "Back in stock: grab it now.", "ok");
      c.msg.dataset.code = "restocked";
    }
    paintPayBox(c.pay, mine ? state.orders.get(mine.order) : undefined, mine ? mine.status : "");
    var held = owned ? state.orders.get(mine.order) : undefined;
    paintCode(c, held && held.view.status === "paid" && held.view.code ? held.view.code : "");
  }

  // drawPhase is where a voucher's draw is: open (taking entries), drawing
  // (closed, the result not known yet), or "" (no draw, or done: a sale
  // as any other).
  function drawPhase(v) {
    if (!v.draw || v.draw.status === "done") { return ""; }
    return v.draw.status === "open" && now() < Date.parse(v.draw.closes_at) ? "open" : "drawing";
  }

  // tickDraw paints the button and the time of a voucher whose draw is
  // open or being drawn, and tells whether it did.
  function tickDraw(c) {
    var v = c.v;
    var dp = drawPhase(v);
    c.li.dataset.draw = dp || (v.draw ? "done" : "");
    if (!dp) { return false; }
    var entry = state.session ? state.draws.get(v.id) : undefined;
    var closes = Date.parse(v.draw.closes_at);
    c.li.className = "voucher draw";
    c.li.classList.remove("mine", "reserved");
    c.grab.classList.remove("yours", "reserved");
    c.grab.classList.toggle("entered", !!entry && !c.busy);
    paintPayBox(c.pay, undefined, "");
    paintCode(c, "");
    // A draw with a proof of work takes entries from its opening, when
    // the challenge is published: no proof can be made before.
    var opens = v.draw.pow_bits > 0 && v.draw.opens_at ? Date.parse(v.draw.opens_at) : 0;
    if (dp === "open" && now() < opens && !entry) {
      c.when.textContent = whenText("Entries open", opens, now());
      c.grab.disabled = true;
      c.grab.textContent = "Opens at " + timeText(opens);
    } else if (dp === "open") {
      c.when.textContent = whenText("The draw closes", closes, now());
      c.grab.disabled = !!entry || !!c.busy;
      c.grab.textContent = c.busy === "pow" ? "Preparing your entry…" : c.busy ? "Joining…" : entry ? "You're in" : "Join the draw";
    } else {
      c.when.textContent = "The draw closed at " + timeText(closes) + ": drawing the winners…";
      c.grab.disabled = true;
      c.grab.textContent = entry ? "You're in: drawing…" : "Drawing…";
    }
    if (entry && !entry.result && c.msg.dataset.code !== "entered") { sayEntered(c, entry); }
    return true;
  }

  // timeText is an instant's time of day on the device: "20:00:01".
  function timeText(ms) {
    var d = new Date(ms);
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  function sayEntered(c, entry) {
    say(c.msg, "You're in: the draw closes at " + timeText(Date.parse(entry.closes)) + ".", "ok");
    c.msg.dataset.code = "entered";
  }

  // paintDraw shows a voucher's draw: the commitment from the start, short
  // (Copy copies it whole; How to check opens the draw's status, All
  // entries the first page of its list), the secret once done, and the
  // buyer's result: won or not, the place, and whether the published
  // secret is the one committed to when the buyer joined.
  function paintDraw(c) {
    var d = c.v.draw;
    c.draw.hidden = !d;
    if (!d) { return; }
    var short = d.commitment.slice(0, 12) + "…";
    if (c.commit.textContent !== short) { c.commit.textContent = short; c.commit.title = d.commitment; }
    c.check.href = "api/v1/vouchers/" + c.v.id + "/draw";
    c.check.title = "The draw's status: the commitment is the SHA-256 of the secret, published once drawn; " +
      "the entries are bought in ascending HMAC-SHA256(secret, digest of the closed list + \":\" + user id). " +
      "`api draw verify --commitment " + d.commitment + " " + c.v.id + "` checks it.";
    c.drawList.hidden = d.status !== "done";
    c.drawList.href = "api/v1/vouchers/" + c.v.id + "/draw/entries";
    c.what.textContent = d.status === "done" ? "Opened with a fair draw: every entry before the close had the same chance." :
      "A fair draw: everyone who joins before the close has the same chance, however fast.";
    c.secret.hidden = !d.secret;
    var code = c.secret.querySelector("code");
    if (d.secret && code.textContent !== d.secret) { code.textContent = d.secret; }
    var e = state.session ? state.draws.get(c.v.id) : undefined;
    var result = e && e.result;
    c.drawResult.hidden = !result;
    c.li.dataset.drawResult = result || "";
    if (result) {
      say(c.drawResult, result === "won" ? "You won the draw ✓" : result === "lost" ? "Not drawn this time" :
        "Your entry is not in the draw's list: keep this page and ask the shop", result === "won" ? "ok" : "bad");
    }
    var placed = !!e && e.place !== undefined && e.place !== null;
    c.drawMine.hidden = !placed;
    if (placed) {
      c.drawMine.textContent = "Your place in the draw: " + (e.place + 1) + (e.count ? " of " + e.count : "") + " (ticket " + e.ticket + ")";
    }
    paintVerify(c, e, d);
  }

  // paintVerify says whether the draw kept the commitment the page showed
  // when the buyer joined: once done, whether the published secret hashes
  // to it; before, a warning if the commitment shown has changed since.
  function paintVerify(c, e, d) {
    var check = e && e.commitment ? e.check || (d.commitment !== e.commitment ? "changed" : "") : "";
    c.drawVerify.hidden = !check;
    c.li.dataset.drawCheck = check;
    if (!check) { return; }
    var saved = e.commitment.slice(0, 12) + "…";
    if (check === "verified") {
      say(c.drawVerify, "Checked ✓ the published secret's SHA-256 is the commitment shown when you joined (" + saved + ").", "ok");
    } else if (check === "mismatch") {
      say(c.drawVerify, "Warning: the published secret does not match the commitment this page showed when you joined (" + saved +
        "): its SHA-256 is " + (e.hash || "").slice(0, 12) + "…. The draw may have been changed after you entered: keep this page and ask the shop.", "bad");
    } else {
      say(c.drawVerify, "Warning: the commitment shown now (" + d.commitment.slice(0, 12) + "…) is not the one shown when you joined (" + saved +
        "). The draw may have been changed after you entered.", "bad");
    }
  }

  // join enters the buyer into a voucher's draw: the proof of work first
  // when the draw asks for one (kept, so a press again brings the same).
  function join(c) {
    var v = c.v, id = v.id, s = state.session;
    var bits = v.draw.pow_bits || 0;
    var send = function (nonce) {
      c.busy = "join";
      tickCard(c);
      call("POST", "vouchers/" + id + "/orders", undefined, undefined, nonce ? { "X-Seckill-Pow": nonce } : undefined).then(function (r) {
        c.busy = false;
        if (state.session !== s) { return; }
        if (r.status === 202 && r.body.status === "entered") {
          // The commitment the page showed at the entry, kept to hold
          // the published secret to once the draw is done.
          var entry = { ticket: r.body.ticket, closes: r.body.draw_closes_at, nonce: nonce || "", commitment: v.draw.commitment };
          state.draws.set(id, entry);
          saveDraws();
          sayEntered(c, entry);
          followDraw(id);
        } else if (r.status === 202) { // the draw was done meanwhile: a purchase as any other
          hold(id, r.body.order_id, "pending");
          showOrder(c, { order_id: r.body.order_id, status: "pending" });
          followOrder(c, r.body.order_id);
        } else {
          if (r.body.code === "pow_required") { c.pow = null; }
          var e = explain(r);
          say(c.msg, e[0], e[1]);
          c.msg.dataset.code = r.body.code || "error";
          if (r.body.code === "drawing") { loadVouchers(); }
        }
        tickCard(c);
      });
    };
    if (bits <= 0) { send(""); return; }
    if (!v.draw.challenge) {
      // The list was read before the opening: the challenge, from the
      // draw's small status (kept by the instances, so cheap at the opening).
      c.busy = "pow";
      tickCard(c);
      call("GET", "vouchers/" + id + "/draw").then(function (r) {
        c.busy = false;
        if (r.status === 200 && r.body.draw && r.body.draw.challenge) {
          v.draw = r.body.draw;
          join(c);
          return;
        }
        var e = r.status === 200 ? MESSAGES.not_started : explain(r);
        say(c.msg, e[0], e[1]);
        tickCard(c);
      });
      return;
    }
    if (c.pow && c.pow.user === s.user_id && c.pow.challenge === v.draw.challenge) { send(c.pow.nonce); return; }
    c.busy = "pow";
    tickCard(c);
    var began = performance.now();
    window.seckillPow.solve(v.draw.challenge, s.user_id, bits).then(function (nonce) {
      c.pow = { user: s.user_id, challenge: v.draw.challenge, nonce: nonce, ms: performance.now() - began };
      c.li.dataset.powMs = String(Math.round(c.pow.ms));
      if (state.session !== s) { c.busy = false; tickCard(c); return; }
      send(nonce);
    });
  }

  // followDraw asks for the status of a draw the buyer entered, from its
  // close until it is done, every DRAW_ASK_EVERY_MS (longer when told to
  // wait), sending back the last answer's ETag; then the buyer's own
  // entry (askMine).
  function followDraw(id) {
    if (state.following.has(id)) { return; }
    state.following.add(id);
    var s = state.session;
    var etag = "";
    var poll = function () {
      var e = state.draws.get(id);
      if (state.session !== s || !e) { state.following.delete(id); return; }
      var wait = Date.parse(e.closes) - now();
      if (wait > 0) { setTimeout(poll, Math.min(wait + 100, 5000)); return; }
      // A winner's order is followed on its card: ask once the cards are
      // there (a page just loaded may hear of the draw before the sale).
      if (!state.loaded) { setTimeout(poll, 100); return; }
      call("GET", "vouchers/" + id + "/draw", undefined, undefined, etag ? { "If-None-Match": etag } : undefined).then(function (r) {
        if (state.session !== s) { state.following.delete(id); return; }
        if (r.status === 200) { etag = r.etag; }
        if (r.status === 200 && r.body.draw && r.body.draw.status === "done") {
          askMine(id, r.body, s);
          return;
        }
        if (r.status === 404) { state.following.delete(id); return; } // the voucher is gone
        setTimeout(poll, Math.max(DRAW_ASK_EVERY_MS, r.retryAfter * 1000));
      });
    };
    poll();
  }

  // askMine asks once for the buyer's own entry in a done draw (by its
  // key: the list is not read), again only if the answer does not say.
  function askMine(id, status, s) {
    call("GET", "vouchers/" + id + "/draw/me").then(function (r) {
      if (state.session !== s) { state.following.delete(id); return; }
      if (r.status === 200 && r.body.status === "done") {
        state.following.delete(id);
        drawDone(id, status, r.body);
        return;
      }
      if (r.status === 404) { state.following.delete(id); return; }
      setTimeout(function () { askMine(id, status, s); }, Math.max(DRAW_ASK_EVERY_MS, r.retryAfter * 1000));
    });
  }

  // drawDone shows a done draw's result: a winner holds the order its
  // ticket names, which then goes as any order; the others were not drawn.
  // The published secret is held to the commitment kept at the entry.
  function drawDone(id, status, mine) {
    var e = state.draws.get(id);
    state.vouchers.forEach(function (v) { if (v.id === id) { v.draw = status.draw; } });
    var c = state.cards.get(id);
    var en = mine.entered && mine.entry;
    e.result = en ? (en.won ? "won" : "lost") : "missing";
    if (en) { e.place = en.place; e.count = status.entry_count; }
    saveDraws();
    checkSecret(id, e, status.draw.secret);
    if (en && en.won) { hold(id, en.ticket, "pending"); }
    if (c) {
      if (!en) {
        say(c.msg, "Your entry is not in the draw's list.", "bad");
        c.msg.dataset.code = "not_listed";
      } else if (en.won) {
        say(c.msg, "You won the draw: confirming your order…", "ok");
        c.msg.dataset.code = "won";
        followOrder(c, en.ticket);
      } else {
        say(c.msg, "Not drawn this time: sold out.", "bad");
        c.msg.dataset.code = "not_drawn";
      }
      tickCard(c);
    }
    loadVouchers();
    loadOrders();
  }

  // checkSecret holds a done draw's published secret to the commitment the
  // page showed when the buyer joined: its SHA-256 in hex must be that
  // commitment. An entry kept before the page kept commitments is not
  // checked.
  function checkSecret(id, e, secret) {
    if (!e.commitment || !secret) { return; }
    sha256Hex(secret).then(function (h) {
      e.hash = h;
      e.check = h === e.commitment ? "verified" : "mismatch";
      saveDraws();
      var c = state.cards.get(id);
      if (c) { tickCard(c); }
    });
  }

  // sha256Hex resolves to the SHA-256 of s's UTF-8 bytes in hex:
  // crypto.subtle where the page may use it (https, localhost), else the
  // proof of work's own SHA-256.
  function sha256Hex(s) {
    if (window.crypto && window.crypto.subtle) {
      return window.crypto.subtle.digest("SHA-256", new TextEncoder().encode(s)).then(function (buf) {
        return Array.prototype.map.call(new Uint8Array(buf), function (b) { return (b < 16 ? "0" : "") + b.toString(16); }).join("");
      });
    }
    return Promise.resolve(window.seckillPow.hex(s));
  }

  // paintCode shows the voucher code of the card's paid order, big, for a
  // cashier to read off the phone, with its Copy button; hidden without one.
  function paintCode(c, code) {
    c.code.hidden = !code;
    if (c.codeText.textContent === code) { return; }
    c.codeText.textContent = code;
    c.copy.textContent = "Copy";
    delete c.copy.dataset.copied;
  }

  // copyCode puts the code el shows on the clipboard: through
  // navigator.clipboard where the page may use it (https, localhost), else
  // through a selected text and execCommand("copy"). When both fail the
  // code is selected, for the buyer to copy by hand.
  function copyCode(el, btn, text) {
    var code = text || el.textContent;
    var done = function (ok) {
      btn.textContent = ok ? "Copied" : "Copy failed: it is selected";
      btn.dataset.copied = ok ? "yes" : "no";
      if (!ok) { getSelection().selectAllChildren(el); }
      clearTimeout(btn.resetTimer);
      btn.resetTimer = setTimeout(function () { btn.textContent = "Copy"; }, 2000);
    };
    if (navigator.clipboard && navigator.clipboard.writeText) {
      navigator.clipboard.writeText(code).then(function () { done(true); }, function () { done(copyBySelection(code)); });
    } else {
      done(copyBySelection(code));
    }
  }

  function copyBySelection(text) {
    var area = document.createElement("textarea");
    area.value = text;
    area.readOnly = true;
    area.className = "offscreen";
    document.body.append(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    area.remove();
    return ok;
  }

  // heldText is the button of a voucher the buyer holds and has not paid
  // for yet.
  function heldText(mine) {
    if (mine.status !== "awaiting_payment") { return "Confirming…"; }
    var e = state.orders.get(mine.order);
    if (!e || !e.dueAt) { return "Reserved"; }
    var left = e.dueAt - Date.now();
    return left > 0 ? "Reserved, pay within " + clock(left) : "Reserved, time is up";
  }

  // paintPayBox shows an order awaiting payment: the time left, its Pay
  // and Cancel buttons, and the gateway's page once it gave one. The box is
  // hidden for any other state. The buttons show once: on the voucher's
  // card (its box is .v-pay), else in My orders (payOnCard).
  function paintPayBox(box, e, status) {
    var due = box.querySelector(".due");
    var open = status === "awaiting_payment" && !!e && e.view.status === "awaiting_payment";
    box.hidden = !open;
    if (!open) { delete due.dataset.order; return; }
    due.dataset.order = e.view.order_id;
    paintDue(due);
    var here = box.classList.contains("v-pay") || !payOnCard(e.view.order_id);
    var payBtn = box.querySelector(".pay"), cancelBtn = box.querySelector(".cancel"), link = box.querySelector(".pay-link");
    box.querySelector(".pair").hidden = !here;
    box.querySelector(".pay-where").hidden = here;
    payBtn.disabled = cancelBtn.disabled = !!e.busy;
    payBtn.textContent = e.busy === "pay" ? "Paying…" : e.view.amount > 0 ? "Pay " + money(e.view.amount) : "Pay";
    cancelBtn.textContent = e.busy === "cancel" ? "Cancelling…" : "Cancel";
    link.hidden = !here || !e.payUrl;
    if (e.payUrl) { link.href = e.payUrl; } else { link.removeAttribute("href"); }
  }

  // payOnCard tells whether an order's Pay and Cancel are on its voucher's
  // card: the card is on the page and shows this order awaiting payment.
  function payOnCard(id) {
    var e = state.orders.get(id);
    if (!e || e.view.status !== "awaiting_payment") { return false; }
    var m = state.mine.get(e.view.voucher_id);
    return state.cards.has(e.view.voucher_id) && !!m && m.order === id && m.status === "awaiting_payment";
  }

  // clock is a time left as m:ss (h:mm:ss past an hour), rounded up: a
  // window of 15 minutes starts at 15:00 and reads 0:00 when it ends.
  function clock(ms) {
    var s = Math.max(0, Math.ceil(ms / 1000));
    var h = Math.floor(s / 3600), m = Math.floor(s / 60) % 60;
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    s %= 60;
    return (h > 0 ? h + ":" + pad(m) : String(m)) + ":" + pad(s);
  }

  // paintDue writes the time left to pay into an element naming its order.
  function paintDue(el) {
    var e = state.orders.get(el.dataset.order || "");
    if (!e || !e.dueAt) { el.textContent = ""; return; }
    var left = e.dueAt - Date.now();
    el.textContent = left > 0 ? "Pay within " + clock(left) : "Payment time is up; checking…";
    el.classList.toggle("late", left < 60000);
  }

  // holds tells whether an order in this state keeps its unit: a failed,
  // cancelled or refunded one gave it back, and its buyer may grab again.
  function holds(status) {
    return status !== "failed" && status !== "cancelled" && status !== "refunded";
  }

  // hold records the state of an order the buyer holds for a voucher, or
  // forgets it once the order gave its unit back.
  function hold(voucherID, orderID, status) {
    if (!holds(status)) {
      var m = state.mine.get(voucherID);
      if (m && m.order === orderID) { state.mine.delete(voucherID); }
    } else {
      state.mine.set(voucherID, { order: orderID, status: status, at: Date.now() });
    }
    var c = state.cards.get(voucherID);
    if (c) { tickCard(c); }
  }

  function grab(id) {
    var c = state.cards.get(id);
    if (!c || c.busy) { return; }
    if (!state.session) {
      say(c.msg, drawPhase(c.v) === "open" ? "Log in first to join the draw." : "Log in first to grab this voucher.", "warn");
      $("phone").focus();
      return;
    }
    if (drawPhase(c.v) === "open") { join(c); return; }
    c.busy = true;
    tickCard(c);
    call("POST", "vouchers/" + id + "/orders").then(function (r) {
      c.busy = false;
      if (r.status === 202) {
        hold(id, r.body.order_id, "pending");
        showOrder(c, { order_id: r.body.order_id, status: "pending" });
        followOrder(c, r.body.order_id);
        loadVouchers();
      } else if (r.body.code === "already_purchased") {
        say(c.msg, "Already yours: see My orders.", "warn");
        c.msg.dataset.code = "already_purchased";
        hold(id, r.body.order_id, "pending");
        loadOrders();
      } else {
        var e = explain(r);
        say(c.msg, e[0], e[1]);
        c.msg.dataset.code = r.body.code || "error";
        if (r.status === 429 && r.retryAfter > 0) { c.holdUntil = Date.now() + r.retryAfter * 1000; }
        if (r.body.code === "sold_out" || r.body.code === "ended") { loadVouchers(); }
      }
      tickCard(c);
    });
  }

  // stateText is an order's state in words for its buyer, with the colour
  // to show it in. No order ids: the voucher code is what a buyer needs.
  function stateText(o) {
    switch (o.status) {
      case "pending": return ["Confirming your order…", "warn"];
      case "awaiting_payment": return ["Reserved: pay" + (o.amount > 0 ? " " + money(o.amount) : "") + " in time to make it yours", "warn"];
      case "paid": return [(o.amount > 0 ? "Paid " + money(o.amount) : "Free") + " ✓ yours", "ok"];
      case "used": return ["Used at the shop", "ok"];
      case "cancelled":
        return ["Cancelled" + (o.cancel_reason === "expired" ? " (expired: not paid in time)" : o.cancel_reason === "buyer" ? " (by you)" : "") +
          (o.needs_refund ? "; your late payment will be refunded" : ""), "bad"];
      case "refunded": return ["Refunded" + (o.needs_refund ? "; your money is on its way back" : ""), "warn"];
      case "failed": return ["Not confirmed" + (o.reason ? " (" + o.reason.replace(/_/g, " ") + ")" : ""), "bad"];
    }
    return [o.status, "warn"];
  }

  // showOrder writes an order's state on its card; data-seen keeps every
  // state the card showed, in order.
  function showOrder(c, o) {
    var w = stateText(o);
    say(c.msg, w[0] + ".", w[1]);
    var status = o.status;
    c.msg.dataset.code = "order";
    c.msg.dataset.order = o.order_id;
    c.msg.dataset.status = status;
    var seen = (c.msg.dataset.seen || "").split(",").filter(Boolean);
    if (seen[seen.length - 1] !== status) { seen.push(status); }
    c.msg.dataset.seen = seen.join(",");
  }

  function followOrder(c, orderID) {
    var until = Date.now() + ORDER_GIVE_UP_MS;
    var poll = function () {
      call("GET", "orders/" + orderID).then(function (r) {
        if (r.status === 200 && r.body.status && r.body.status !== "pending") {
          if (!r.body.voucher_id) { r.body.voucher_id = c.v.id; } // a dead letter may not name it
          settle(learn(r.body, r.at));
          loadOrders();
          return;
        }
        if (Date.now() > until) {
          say(c.msg, "Your order is still being confirmed; see My orders in a moment.", "warn");
          return;
        }
        if (r.status === 401) { return; }
        setTimeout(poll, ORDER_EVERY_MS);
      });
    };
    setTimeout(poll, ORDER_EVERY_MS);
  }

  // learn keeps what the server said of an order; the time left to pay
  // counts down from the moment the answer arrived (arrived, the device's
  // clock), so neither clock's offset matters.
  function learn(o, arrived) {
    var e = state.orders.get(o.order_id) || { askedAt: 0, payUrl: "", busy: "" };
    e.view = o;
    if (o.status === "awaiting_payment" && typeof o.pay_seconds_left === "number") {
      e.dueAt = arrived + Math.max(0, o.pay_seconds_left) * 1000;
    } else {
      e.dueAt = 0;
      e.payUrl = "";
    }
    state.orders.set(o.order_id, e);
    return e;
  }

  // settle shows an order's new state everywhere the page shows it.
  function settle(e) {
    var o = e.view;
    hold(o.voucher_id, o.order_id, o.status);
    var c = state.cards.get(o.voucher_id);
    if (c) { showOrder(c, o); tickCard(c); }
    renderOrders();
  }

  // refreshOrder asks for an order again; a state that changed (an expiry,
  // a payment on the gateway's page) is shown, and the stock read again.
  function refreshOrder(id) {
    var e = state.orders.get(id);
    var before = e ? e.view.status : "";
    return call("GET", "orders/" + id).then(function (r) {
      if (r.status !== 200 || !r.body.order_id) { return; }
      var got = learn(r.body, r.at);
      if (got.view.status !== before) {
        settle(got);
        loadVouchers();
      }
    });
  }

  // act sends the buyer's Pay or Cancel; the answer, or the state the
  // order turned out to be in, is shown in msg (a card's or My orders').
  function act(what, id, msg) {
    var e = state.orders.get(id);
    if (!e || e.busy) { return; }
    e.busy = what;
    repaint();
    call("POST", "orders/" + id + "/" + what).then(function (r) {
      e.busy = "";
      if (r.status === 200) {
        var o = what === "pay" ? r.body.order : r.body;
        var p = (what === "pay" && r.body.payment) || {};
        if (o && o.order_id) {
          var got = learn(o, r.at);
          if (o.status === "awaiting_payment" && webURL(p.pay_url)) { got.payUrl = p.pay_url; }
          settle(got);
          if (msg.id === "orders-msg") {
            var w = stateText(o);
            say(msg, w[0] + ".", w[1]);
          }
          if (got.payUrl) {
            say(msg, "Continue to payment on the payment page; this page follows it.", "warn");
          }
        }
      } else {
        var x = explain(r);
        say(msg, r.body.code === "wrong_state" ? "This order can no longer be changed." : x[0], x[1]);
        if (msg.dataset) { msg.dataset.code = r.body.code || "error"; }
      }
      repaint();
      if (r.status !== 200 && r.status !== 0) { refreshOrder(id); } // what state is it in, then?
      loadOrders();
      loadVouchers();
    });
  }
  function pay(id, msg) { act("pay", id, msg); }
  function cancel(id, msg) { act("cancel", id, msg); }

  // webURL accepts only a web address for the gateway's page.
  function webURL(u) {
    if (typeof u !== "string" || !u) { return false; }
    try {
      var p = new URL(u, document.baseURI).protocol;
      return p === "https:" || p === "http:";
    } catch (err) {
      return false;
    }
  }

  function repaint() {
    state.cards.forEach(tickCard);
    renderOrders();
  }

  // tickDues counts the times left to pay down, and asks again for an
  // order whose time is up (the server cancels it) or that is being paid on
  // the gateway's page.
  function tickDues() {
    var t = Date.now();
    state.orders.forEach(function (e, id) {
      if (e.view.status !== "awaiting_payment" || e.busy || !e.dueAt) { return; }
      var late = t - e.dueAt;
      var every = late >= 0 ? DUE_ASK_EVERY_MS : e.payUrl ? GATEWAY_ASK_EVERY_MS : 0;
      if (every > 0 && late < DUE_GIVE_UP_MS && t - e.askedAt >= every) {
        e.askedAt = t;
        refreshOrder(id);
      }
    });
    document.querySelectorAll(".due[data-order]").forEach(paintDue);
    // Cards come and go, and orders change hands between them and My
    // orders: its boxes follow.
    document.querySelectorAll("#orders .pay-box[data-order]").forEach(function (box) {
      var e = state.orders.get(box.dataset.order);
      if (e && !e.busy) { paintPayBox(box, e, e.view.status); }
    });
  }

  setInterval(function () { state.cards.forEach(tickCard); tickDues(); }, 250);
  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "visible") { pollVouchers(); }
  });

  // ---- my orders ---------------------------------------------------------

  function loadOrders() {
    var s = state.session;
    if (!s) { return; }
    var asked = Date.now();
    call("GET", "users/me/orders?limit=50").then(function (r) {
      if (r.status !== 200 || state.session !== s) { return; }
      // The list says which vouchers the buyer holds; an order this page
      // saw accepted after the list was asked for is kept until it shows.
      var mine = new Map();
      state.mine.forEach(function (m, id) { if (m.at >= asked) { mine.set(id, m); } });
      var orders = r.body.orders || [];
      orders.slice().reverse().forEach(function (o) {
        if (holds(o.status)) {
          mine.set(o.voucher_id, { order: o.order_id, status: o.status, at: asked });
        } else if (mine.has(o.voucher_id) && mine.get(o.voucher_id).order === o.order_id) {
          mine.delete(o.voucher_id);
        }
      });
      state.mine = mine;
      state.list = orders.map(function (o) { return learn(o, r.at).view.order_id; });
      state.cards.forEach(tickCard);
      renderOrders();
    });
  }

  // renderOrders lists My orders: each state in words, and for an order
  // awaiting payment the time left with its Pay and Cancel buttons.
  function renderOrders() {
    var titles = new Map(state.vouchers.map(function (v) { return [v.id, v.title]; }));
    var ul = $("orders");
    var items = state.list.map(function (id) {
      var e = state.orders.get(id);
      var o = e.view;
      var li = document.createElement("li");
      li.dataset.orderId = o.order_id;
      li.dataset.status = o.status;
      var what = document.createElement("span");
      what.textContent = titles.get(o.voucher_id) || "A voucher";
      if (o.code && o.status === "paid") {
        var code = document.createElement("span");
        code.className = "code";
        code.textContent = o.code;
        what.append(" · code ", code, ", show it at the shop");
      }
      var st = document.createElement("span");
      st.className = "st st-" + o.status;
      st.textContent = stateText(o)[0];
      li.append(what, st);
      if (o.status === "awaiting_payment") {
        var box = $("pay-tpl").content.firstElementChild.cloneNode(true);
        box.dataset.order = id;
        box.querySelector(".pay").addEventListener("click", function () { pay(id, $("orders-msg")); });
        box.querySelector(".cancel").addEventListener("click", function () { cancel(id, $("orders-msg")); });
        paintPayBox(box, e, o.status);
        li.append(box);
      }
      return li;
    });
    ul.replaceChildren.apply(ul, items);
    $("orders-empty").hidden = items.length > 0;
  }

  // ---- start -------------------------------------------------------------

  renderSession();
  pollVouchers();
})();
