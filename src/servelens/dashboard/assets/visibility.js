// Tell the dashboard whether its tab is visible: the pages' refresh intervals pause while
// it is hidden (dashboard.app.pause_when_hidden). A file, not an inline script, so the
// Content-Security-Policy needs no hash for it.
document.addEventListener("visibilitychange", function () {
    if (window.dash_clientside && window.dash_clientside.set_props) {
        window.dash_clientside.set_props("page-visible", {data: document.visibilityState !== "hidden"});
    }
});
