// The language switch: a "中文" link on every English page and an "English" link on every
// Chinese page, to the same page in the other edition. The English site is at the root and the
// Chinese one under zh/; the English chapters sit in book/ (the root book's sources), the Chinese
// ones at the top of zh/ (book/zh is a book of its own). This script finds the root of its own
// edition from its own address (<root>/_static/lang-switch.js), so the site may live at any path.
(function () {
  "use strict";
  var script = document.currentScript;
  if (!script) return;
  var base = script.src.replace(/_static\/lang-switch\.js(\?.*)?$/, ""); // this edition's root
  var isZh = /\/zh\/$/.test(base);
  var root = isZh ? base.slice(0, -3) : base; // the English root
  var here = window.location.href.split("#")[0].split("?")[0];
  if (here.indexOf(base) !== 0) return;
  var page = here.slice(base.length); // e.g. book/01_why_order.html, or 01_why_order.html in zh
  // pages that both editions keep at their root: index, search, genindex, module index, _modules
  var shared = page === "" || /^(index|search|genindex|py-modindex)\.html$/.test(page) ||
    page.indexOf("_") === 0;

  var target;
  if (isZh) {
    target = root + (shared ? page : "book/" + page);
  } else {
    target = base + "zh/" + (page.indexOf("book/") === 0 ? page.slice(5) : page);
  }

  function insert() {
    var link = document.createElement("a");
    link.href = target;
    link.className = "btn btn-sm lang-switch";
    link.textContent = isZh ? "English" : "中文";
    link.title = isZh ? "Read this page in English" : "阅读本页的中文版";
    link.setAttribute("hreflang", isZh ? "en" : "zh-CN");
    link.setAttribute("lang", isZh ? "en" : "zh-CN");
    link.style.fontWeight = "600";
    link.style.whiteSpace = "nowrap";
    var bar = document.querySelector(".article-header-buttons") ||
      document.querySelector(".header-article-items__end");
    if (bar) {
      bar.insertBefore(link, bar.firstChild);
    } else {
      link.style.position = "fixed";
      link.style.top = "0.5rem";
      link.style.right = "0.5rem";
      link.style.zIndex = "1000";
      document.body.appendChild(link);
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", insert);
  } else {
    insert();
  }
})();
