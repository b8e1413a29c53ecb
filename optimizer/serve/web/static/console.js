// fleetfit console: acknowledge / dismiss / reopen through the same API as curl, with the bearer token the
// person typed once; it is kept in sessionStorage, so it lasts until the browser session ends. The same token
// goes in a session cookie for page reads (where [api] read_requires_token asks for one); decisions send it in
// the Authorization header only, which no other site can make this browser send.
"use strict";
(function () {
  var KEY = "fleetfit-token";
  var status = document.getElementById("status");
  var tokenState = document.getElementById("token-state");
  function say(text) { if (status) { status.textContent = text; } }
  var who = document.getElementById("who");
  function cookie(token) {
    document.cookie = "fleetfit-token=" + (token ? encodeURIComponent(token) : "; max-age=0") + "; path=/; SameSite=Strict";
  }
  function showWho() {
    var token = sessionStorage.getItem(KEY);
    if (!who) { return; }
    if (!token) { who.textContent = "not signed in"; return; }
    fetch("/api/v1/whoami", { headers: { Authorization: "Bearer " + token }, credentials: "omit" })
      .then(function (r) {
        return r.json().then(function (me) {
          who.textContent = "signed in as " + me.name + " (" + me.role + ")" + (me.note ? ": " + me.note : "");
        }, function () { who.textContent = "token not accepted (" + r.status + ")"; });
      }).catch(function () { who.textContent = "signed in: not checked"; });
  }
  function showToken() {
    if (tokenState) { tokenState.textContent = sessionStorage.getItem(KEY) ? "token set for this session" : "no token"; }
    showWho();
  }
  var form = document.getElementById("token-form");
  if (form) {
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      var input = document.getElementById("token");
      if (input.value) { sessionStorage.setItem(KEY, input.value); cookie(input.value); input.value = ""; }
      showToken();
      if (document.getElementById("sign-in")) { window.location.reload(); }
    });
    document.getElementById("token-forget").addEventListener("click", function () {
      sessionStorage.removeItem(KEY); cookie(""); showToken();
    });
    showToken();
  } else {
    showWho();
  }
  var labels = { ack: "Acknowledge", dismiss: "Dismiss", reopen: "Reopen" };
  function allowed(state) {
    if (state === "new") { return ["ack", "dismiss"]; }
    if (state === "acknowledged") { return ["dismiss", "reopen"]; }
    if (state === "dismissed") { return ["reopen"]; }
    return [];
  }
  function redraw(cell, id, name, state) {
    var row = cell.parentNode;
    var badge = row.querySelector(".state");
    badge.textContent = state; badge.setAttribute("data-state", state);
    cell.textContent = "";
    allowed(state).forEach(function (a) {
      var b = document.createElement("button");
      b.type = "button"; b.className = "decide"; b.textContent = labels[a];
      b.setAttribute("data-id", id); b.setAttribute("data-action", a);
      b.setAttribute("aria-label", labels[a] + " " + name);
      cell.appendChild(b);
    });
  }
  document.addEventListener("click", function (e) {
    var b = e.target.closest ? e.target.closest("button.decide") : null;
    if (!b) { return; }
    var id = b.getAttribute("data-id"), action = b.getAttribute("data-action");
    var name = (b.getAttribute("aria-label") || "").replace(/^\S+ /, "");
    var token = sessionStorage.getItem(KEY);
    if (!token) { say("Enter the API token above first."); document.getElementById("token").focus(); return; }
    b.disabled = true;
    fetch("/api/v1/recommendations/" + encodeURIComponent(id) + "/" + action, {
      method: "POST", headers: { Authorization: "Bearer " + token }, credentials: "omit"
    }).then(function (r) {
      return r.text().then(function (text) {
        if (r.ok) {
          var state = JSON.parse(text).state;
          redraw(b.parentNode, id, name, state);
          say(name + ": " + state + ".");
        } else {
          b.disabled = false;
          say("Refused (" + r.status + "): " + text.trim());
        }
      });
    }).catch(function (err) { b.disabled = false; say("Could not reach the optimizer: " + err); });
  });
})();
