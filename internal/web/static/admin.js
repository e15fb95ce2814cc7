// The shop's console: sale figures, orders, redeem by code, money to
// return, new vouchers. Plain JavaScript, no build step, no inline script;
// every text from the server goes in through textContent. It shares the
// shop page's session (localStorage), so an admin logged in there is
// logged in here.
(function () {
  "use strict";

  var API = new URL("api/v1/", document.baseURI).toString();
  var SESSION_KEY = "seckill.session";
  var FIGURES_EVERY_MS = 3000;
  var REFUNDS_EVERY_MS = 10000;

  var $ = function (id) { return document.getElementById(id); };
  var state = { session: loadSession(), titles: new Map(), figuresTimer: 0, refundsTimer: 0, lastQuery: "", revokeUser: 0 };

  function loadSession() {
    try {
      var s = JSON.parse(localStorage.getItem(SESSION_KEY) || "null");
      if (s && s.token && Date.parse(s.expires_at) > Date.now()) { return s; }
    } catch (e) { /* a broken entry is no session */ }
    return null;
  }

  function saveSession(s) {
    state.session = s;
    if (s) { localStorage.setItem(SESSION_KEY, JSON.stringify(s)); } else { localStorage.removeItem(SESSION_KEY); }
    render();
  }

  function isAdmin() { return !!(state.session && state.session.role === "admin"); }

  function render() {
    var s = state.session;
    $("who").textContent = s ? ((s.phone || ("user " + s.user_id)) + (s.role === "admin" ? " · admin" : "")) : "";
    $("logout").hidden = !s;
    $("signin-panel").hidden = isAdmin();
    $("console").hidden = !isAdmin();
    if (s && !isAdmin()) { say($("token-msg"), "You are logged in as a shopper: the console is for the shop's staff.", "warn"); }
    clearTimeout(state.figuresTimer);
    clearTimeout(state.refundsTimer);
    if (isAdmin()) { pollFigures(); pollRefunds(); search(""); }
  }

  function call(method, path, body, token) {
    var headers = { "Accept": "application/json" };
    if (body !== undefined) { headers["Content-Type"] = "application/json"; }
    var bearer = token || (state.session && state.session.token);
    if (bearer) { headers["Authorization"] = "Bearer " + bearer; }
    return fetch(API + path, {
      method: method, headers: headers, cache: "no-store", credentials: "omit",
      body: body === undefined ? undefined : JSON.stringify(body),
    }).then(function (resp) {
      return resp.json().catch(function () { return {}; }).then(function (b) {
        var r = { status: resp.status, body: b || {} };
        if (r.status === 401 && state.session && !token) {
          saveSession(null);
          notice("Your session ended; sign in again.", "bad");
        }
        return r;
      });
    }, function () {
      return { status: 0, body: { code: "network", message: "network error" } };
    });
  }

  function problem(r) {
    if (r.status === 0) { return "Network error: check the connection."; }
    if (r.status >= 500) { return "The service cannot answer right now; try again in a moment."; }
    if (r.status === 403) { return "Only the shop's staff (admins) may do this."; }
    return r.body.message || ("Error " + r.status);
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

  function money(cents) { return "¥" + (cents / 100).toFixed(cents % 100 === 0 ? 0 : 2); }

  function timeText(iso) {
    var d = new Date(iso);
    if (isNaN(d)) { return ""; }
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  function button(text, quiet, onClick) {
    var b = document.createElement("button");
    b.type = "button";
    b.className = "small" + (quiet ? " quiet" : "");
    b.textContent = text;
    b.addEventListener("click", function () { onClick(b); });
    return b;
  }

  // ---- sign-in --------------------------------------------------------------

  function claimsOf(token) {
    var parts = token.split(".");
    if (parts.length !== 3) { return null; }
    try {
      var b64 = parts[1].replace(/-/g, "+").replace(/_/g, "/");
      var c = JSON.parse(atob(b64 + "===".slice((b64.length + 3) % 4)));
      var user = Number(c.sub);
      if (!(Number.isInteger(user) && user > 0) || typeof c.exp !== "number" || (c.role !== "user" && c.role !== "admin")) { return null; }
      return { user_id: user, role: c.role, expires_at: new Date(c.exp * 1000).toISOString() };
    } catch (e) {
      return null;
    }
  }

  $("token-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    var msg = $("token-msg");
    var token = $("token").value.trim().replace(/^Bearer\s+/i, "");
    var c = claimsOf(token);
    if (!c) { say(msg, "That is not a seckill token.", "bad"); return; }
    if (Date.parse(c.expires_at) <= Date.now()) { say(msg, "That token has expired; mint a new one.", "bad"); return; }
    if (c.role !== "admin") { say(msg, "That is a shopper's token: the console needs an admin token.", "bad"); return; }
    $("use-token").disabled = true;
    call("GET", "admin/refunds?limit=1", undefined, token).then(function (r) {
      $("use-token").disabled = false;
      if (r.status === 200) {
        $("token").value = "";
        say(msg, "", "");
        saveSession({ token: token, role: c.role, user_id: c.user_id, expires_at: c.expires_at, phone: "" });
        return;
      }
      say(msg, r.status === 401 ? "The service does not take this token (another secret, or expired)." : problem(r), "bad");
    });
  });

  $("logout").addEventListener("click", function () { saveSession(null); say($("token-msg"), "", ""); });

  // ---- figures ----------------------------------------------------------------

  var COLS = ["stock_left", "sold", "awaiting_payment", "paid", "used", "cancelled", "expired", "refunded"];

  function pollFigures() {
    clearTimeout(state.figuresTimer);
    if (!isAdmin()) { return; }
    var next = function () { state.figuresTimer = setTimeout(pollFigures, FIGURES_EVERY_MS); };
    if (document.visibilityState === "hidden") { next(); return; }
    loadFigures().then(next, next);
  }

  function loadFigures() {
    return call("GET", "admin/figures").then(function (r) {
      if (r.status !== 200) { say($("figures-msg"), "Cannot read the figures: " + problem(r), "bad"); return; }
      $("window").textContent = String(r.body.window_seconds);
      // On a phone a row is a card, each figure labelled by its column
      // (app.css): the labels are the table's head.
      var labels = Array.prototype.map.call($("figures").tHead.rows[0].cells, function (th) { return th.title || th.textContent; });
      var rows = (r.body.vouchers || []).map(function (f) {
        state.titles.set(f.voucher_id, f.title);
        var tr = document.createElement("tr");
        tr.dataset.voucherId = String(f.voucher_id);
        var cells = [f.title + " (#" + f.voucher_id + ")", f.price > 0 ? money(f.price) : "free"];
        COLS.forEach(function (k) { cells.push(String(f[k])); });
        cells.push(money(f.revenue), f.purchases_per_second.toFixed(1));
        var keys = ["title", "price"].concat(COLS, ["revenue", "per_second"]);
        cells.forEach(function (text, i) {
          var td = document.createElement(i === 0 ? "th" : "td");
          if (i === 0) { td.scope = "row"; }
          td.textContent = text;
          td.dataset.k = keys[i];
          td.dataset.label = labels[i] || "";
          if (i > 1 && i < 2 + COLS.length) { td.dataset.n = text; }
          tr.append(td);
        });
        tr.dataset.revenue = String(f.revenue);
        return tr;
      });
      var body = $("figures").tBodies[0];
      body.replaceChildren.apply(body, rows);
      say($("figures-msg"), "As of " + timeText(r.body.at) + (rows.length ? "" : ": no vouchers yet."), "");
    });
  }

  // ---- redeem by code ---------------------------------------------------------

  $("redeem-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    var msg = $("redeem-msg");
    var code = $("r-code").value.trim();
    if (!code) { say(msg, "Type the code the buyer shows.", "bad"); return; }
    $("r-redeem").disabled = true;
    call("POST", "admin/redeem", { code: code }).then(function (r) {
      $("r-redeem").disabled = false;
      msg.dataset.code = r.body.code && r.status !== 200 ? r.body.code : "redeemed";
      if (r.status === 200) {
        say(msg, "Redeemed ✓ " + (state.titles.get(r.body.voucher_id) || "voucher") + " (" + (r.body.amount > 0 ? "paid " + money(r.body.amount) : "free") + "). Hand it over.", "ok");
        $("r-code").value = "";
        loadFigures();
        if (state.lastQuery) { search(state.lastQuery); }
        return;
      }
      if (r.body.code === "code_used") { say(msg, "Already used at " + timeText(r.body.used_at) + ": do not accept it again.", "bad"); return; }
      if (r.body.code === "code_not_found") { say(msg, "No voucher has this code: check it with the buyer.", "bad"); return; }
      say(msg, r.body.code === "wrong_state" ? "Not valid: " + r.body.message + "." : problem(r), "bad");
    });
  });

  // ---- orders -----------------------------------------------------------------

  function search(q) {
    state.lastQuery = q;
    var path = "admin/orders?limit=50" + (q ? "&q=" + encodeURIComponent(q) : "");
    return call("GET", path).then(function (r) {
      if (r.status !== 200) { say($("search-msg"), "Cannot search: " + problem(r), "bad"); return; }
      var items = (r.body.orders || []).map(orderItem);
      var ul = $("found");
      ul.replaceChildren.apply(ul, items);
      $("found-empty").hidden = items.length > 0;
    });
  }

  function orderItem(o) {
    var li = document.createElement("li");
    li.dataset.orderId = o.order_id;
    li.dataset.status = o.status;
    if (o.code) { li.dataset.code = o.code; }
    var what = document.createElement("span");
    what.textContent = (state.titles.get(o.voucher_id) || ("voucher #" + o.voucher_id)) + " · order " + o.order_id +
      (o.phone ? " · " + o.phone : "") + (o.amount > 0 ? " · " + money(o.amount) : " · free");
    var code = document.createElement("span");
    code.className = "code";
    code.textContent = o.code || "";
    var st = document.createElement("span");
    st.className = "st st-" + o.status;
    st.textContent = o.status.replace(/_/g, " ") + (o.used_at && o.status === "used" ? " " + timeText(o.used_at) : "") + (o.needs_refund ? ", money owed" : "");
    var pair = document.createElement("span");
    pair.className = "pair";
    var redeem = button("Redeem", false, function (b) { orderAction(o, "redeem", b); });
    var refund = button("Refund", true, function () { askRefund(o, pair); });
    redeem.classList.add("redeem");
    refund.classList.add("refund");
    redeem.disabled = refund.disabled = o.status !== "paid";
    pair.append(redeem, refund);
    li.append(what, code, st, pair);
    return li;
  }

  // askRefund asks before a refund, which cannot be undone: the order's
  // buttons give way to "Confirm refund" and "Keep", and only the first
  // sends it. Keep puts Redeem and Refund back.
  function askRefund(o, pair) {
    var before = Array.prototype.slice.call(pair.children);
    var msg = $("search-msg");
    var yes = button("Confirm refund" + (o.amount > 0 ? " " + money(o.amount) : ""), false, function (b) {
      keep.disabled = true;
      orderAction(o, "refund", b);
    });
    var keep = button("Keep", true, function () {
      pair.replaceChildren.apply(pair, before);
      delete pair.dataset.asking;
      say(msg, "", "");
      before[before.length - 1].focus();
    });
    yes.classList.add("confirm-refund");
    keep.classList.add("keep");
    pair.dataset.asking = "refund";
    pair.replaceChildren(yes, keep);
    say(msg, "Refund order " + o.order_id + "? The voucher can no longer be used" +
      (o.amount > 0 ? " and its " + money(o.amount) + " is listed under Money to return" : "") + ". Confirm, or keep the order.", "warn");
    yes.focus();
  }

  function orderAction(o, what, btn) {
    btn.disabled = true;
    var msg = $("search-msg");
    call("POST", "orders/" + o.order_id + "/" + what).then(function (r) {
      if (r.status === 200) {
        say(msg, "Order " + o.order_id + ": " + r.body.status + (r.body.needs_refund ? "; its money is listed under Money to return" : "") + ".", "ok");
      } else {
        btn.disabled = false;
        say(msg, "Order " + o.order_id + ": " + problem(r), "bad");
      }
      search(state.lastQuery);
      loadFigures();
      loadRefunds();
    });
  }

  $("search-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    say($("search-msg"), "", "");
    search($("q").value.trim());
  });

  // ---- money to return ---------------------------------------------------------

  var REASONS = { late: "came after its order was cancelled", duplicate: "paid an order twice", order_refunded: "its order was refunded" };

  function pollRefunds() {
    clearTimeout(state.refundsTimer);
    if (!isAdmin()) { return; }
    var next = function () { state.refundsTimer = setTimeout(pollRefunds, REFUNDS_EVERY_MS); };
    loadRefunds().then(next, next);
  }

  function loadRefunds() {
    return call("GET", "admin/refunds").then(function (r) {
      if (r.status !== 200) { say($("refunds-msg"), "Cannot list the money to return: " + problem(r), "bad"); return; }
      var items = (r.body.payments || []).map(function (p) {
        var li = document.createElement("li");
        li.dataset.paymentId = String(p.payment_id);
        li.dataset.orderId = p.order_id;
        var what = document.createElement("span");
        what.textContent = money(p.amount || 0) + " · order " + p.order_id + " · " + (REASONS[p.refund_reason] || p.refund_reason) +
          " · " + p.provider + " " + p.reference + (p.refund_requested_at ? " · owed since " + timeText(p.refund_requested_at) : "");
        var b = button("Mark returned", false, function (btn) {
          btn.disabled = true;
          call("POST", "admin/payments/" + p.payment_id + "/refunded").then(function (a) {
            if (a.status === 200) {
              say($("refunds-msg"), money(p.amount || 0) + " of order " + p.order_id + " marked returned.", "ok");
            } else {
              btn.disabled = false;
              say($("refunds-msg"), problem(a), "bad");
            }
            loadRefunds();
          });
        });
        li.append(what, b);
        return li;
      });
      var ul = $("refunds");
      ul.replaceChildren.apply(ul, items);
      $("refunds-empty").hidden = items.length > 0;
    });
  }

  // ---- new voucher -------------------------------------------------------------

  function localInput(d) {
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + "T" + pad(d.getHours()) + ":" + pad(d.getMinutes());
  }

  function resetTimes() {
    var start = new Date();
    start.setSeconds(0, 0);
    $("v-begin").value = localInput(start);
    $("v-end").value = localInput(new Date(start.getTime() + 24 * 3600 * 1000));
  }

  $("admin-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    var msg = $("admin-msg");
    var title = $("v-title").value.trim();
    var face = Math.round(parseFloat($("v-face").value) * 100);
    var priceText = $("v-price").value.trim();
    var price = priceText === "" ? 0 : Math.round(parseFloat(priceText) * 100);
    var stock = Number($("v-stock").value);
    var begin = new Date($("v-begin").value);
    var end = new Date($("v-end").value);
    var bad =
      !title ? "Enter a title." :
      !(face >= 0) ? "Enter the face value, such as 50." :
      !(price >= 0) ? "Enter the price to pay, such as 9.90, or 0 for free." :
      price > face ? "The price to pay cannot be above the face value." :
      !(Number.isInteger(stock) && stock > 0) ? "Enter the stock: a whole number above 0." :
      isNaN(begin) || isNaN(end) ? "Enter when the sale starts and ends." :
      begin >= end ? "The sale must start before it ends." : "";
    if (bad) { say(msg, bad, "bad"); return; }
    $("v-create").disabled = true;
    call("POST", "vouchers", {
      title: title, face_value: face, price: price, stock: stock, begin_at: begin.toISOString(), end_at: end.toISOString(),
    }).then(function (r) {
      $("v-create").disabled = false;
      if (r.status === 201) {
        say(msg, "Created " + r.body.voucher.title + " (#" + r.body.voucher.id + ").", "ok");
        $("admin-form").reset();
        resetTimes();
        loadFigures();
        return;
      }
      say(msg, r.body.message || problem(r), "bad");
    });
  });

  // ---- admin tokens ------------------------------------------------------------

  // Revoke asks first, as a refund does: the user's tokens cannot be given
  // back, only new ones minted.
  function revokeAsk(show) {
    $("revoke-ask").hidden = !show;
    $("revoke").disabled = show;
    $("revoke-user").disabled = show;
  }

  $("revoke-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    var msg = $("revoke-msg");
    var text = $("revoke-user").value.trim();
    var id = Number(text);
    if (!/^[0-9]+$/.test(text) || !Number.isSafeInteger(id) || id <= 0) { say(msg, "Type the user id: a whole number above 0.", "bad"); return; }
    state.revokeUser = id;
    var self = state.session && state.session.user_id === id;
    say(msg, "Revoke every admin token of user " + id + " minted until now?" + (self ? " That is you: this session ends too." : "") +
      " Confirm, or keep them.", "warn");
    revokeAsk(true);
    $("revoke-confirm").focus();
  });

  $("revoke-keep").addEventListener("click", function () {
    revokeAsk(false);
    say($("revoke-msg"), "", "");
    $("revoke-user").focus();
  });

  $("revoke-confirm").addEventListener("click", function () {
    var id = state.revokeUser;
    var msg = $("revoke-msg");
    $("revoke-confirm").disabled = $("revoke-keep").disabled = true;
    call("POST", "admin/users/" + id + "/revoke-tokens").then(function (r) {
      $("revoke-confirm").disabled = $("revoke-keep").disabled = false;
      revokeAsk(false);
      msg.dataset.code = r.status === 200 ? "revoked" : (r.body.code || String(r.status));
      if (r.status !== 200) { say(msg, problem(r), "bad"); return; }
      $("revoke-user").value = "";
      say(msg, "User " + id + "'s admin tokens minted until now are refused (token version " + r.body.token_version +
        "). A new one: api token --user " + id + " --admin.", "ok");
      if (state.session && state.session.user_id === id) {
        saveSession(null);
        notice("You took back your own admin tokens: sign in with a new one.", "warn");
      }
    });
  });

  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "visible" && isAdmin()) { pollFigures(); }
  });

  resetTimes();
  render();
})();
