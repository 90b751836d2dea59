// The console's only script: a running execution's page refreshes itself from /execution/live (UI-5).
// The fragment is rendered and escaped on the server; nothing from the journal is ever turned into markup here.
(function () {
  'use strict';
  var live = document.getElementById('live');
  if (!live) {
    return;
  }
  var state = live.getAttribute('data-state');
  function refresh() {
    fetch(live.getAttribute('data-src'), { credentials: 'same-origin', cache: 'no-store' })
      .then(function (response) {
        if (!response.ok) {
          throw new Error('status ' + response.status);
        }
        state = response.headers.get('x-execution-state') || state;
        return response.text();
      })
      .then(function (html) {
        live.innerHTML = html;
        live.setAttribute('data-state', state);
        var badge = document.getElementById('state');
        if (badge) {
          badge.textContent = state;
          badge.className = 'badge state-' + state;
        }
      })
      .catch(function () {})
      .then(function () {
        if (state === 'running') {
          window.setTimeout(refresh, 1000);
        }
      });
  }
  if (state === 'running') {
    window.setTimeout(refresh, 1000);
  }
})();
