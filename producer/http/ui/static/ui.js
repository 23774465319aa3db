// cosyq /ui: the player's playhead and piece highlighting, keyboard judging, fleet polling.
// No library; runs after the page is parsed (defer).
(function () {
  "use strict";
  var player = document.getElementById("player");
  if (player) {
    var pieces = Array.prototype.slice.call(document.querySelectorAll(".piece"));
    var head = document.getElementById("playhead");
    var box = document.getElementById("wave-box");
    var total = box ? parseFloat(box.dataset.duration) || 0 : 0;
    player.addEventListener("timeupdate", function () {
      var t = player.currentTime;
      pieces.forEach(function (li) {
        var on = t >= parseFloat(li.dataset.start) && t < parseFloat(li.dataset.end);
        li.classList.toggle("playing", on);
      });
      var length = player.duration || total;
      if (head && length > 0) { head.style.left = Math.min(100, (100 * t) / length) + "%"; }
    });
    pieces.forEach(function (li) {
      li.addEventListener("click", function () {
        player.currentTime = parseFloat(li.dataset.start);
        player.play();
      });
    });
    if (box) {
      box.addEventListener("click", function (event) {
        var rect = box.getBoundingClientRect();
        var length = player.duration || total;
        player.currentTime = (length * (event.clientX - rect.left)) / rect.width;
      });
    }
  }
  var whole = document.getElementById("document-player");
  if (whole) {
    var stopAt = null;
    whole.addEventListener("timeupdate", function () {
      if (stopAt !== null && whole.currentTime >= stopAt) { whole.pause(); stopAt = null; }
    });
    document.querySelectorAll(".segment-play").forEach(function (button) {
      button.addEventListener("click", function () {
        whole.currentTime = parseFloat(button.dataset.start);
        stopAt = parseFloat(button.dataset.end);
        whole.play();
      });
    });
  }
  var judge = document.getElementById("judge");
  if (judge) {
    document.addEventListener("keydown", function (event) {
      if (event.target.tagName === "INPUT" || event.ctrlKey || event.metaKey || event.altKey) { return; }
      var key = event.key.toLowerCase();
      if (key === " " && player) {
        event.preventDefault();
        if (player.paused) { player.play(); } else { player.pause(); }
        return;
      }
      var form = judge.querySelector('form[data-key="' + key + '"]');
      if (form) { event.preventDefault(); form.submit(); }
    });
    if (judge.dataset.queue === "1" && player) { player.play().catch(function () {}); }
  }
  var poll = document.querySelector("[data-poll]");
  if (poll) {
    window.setTimeout(function () { window.location.reload(); }, 1000 * parseFloat(poll.dataset.poll));
  }
})();
