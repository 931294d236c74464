//! A self-contained HTML page (no network) for browsing a scheduled
//! recording: pick a command buffer, scroll its levels, see each node's
//! byte ranges with buffer names. The dump is embedded as JSON.

use crate::dump::Dump;

const TEMPLATE: &str = include_str!("graph_page.html");

/// The page for `dump`.
pub fn render(dump: &Dump, title: &str) -> String {
    let json = serde_json::to_string(dump).unwrap_or_else(|_| "{}".into());
    // Keep the JSON inert inside <script>: no "</" sequences.
    let json = json.replace("</", "<\\/");
    TEMPLATE
        .replace("__TITLE__", &html_escape(title))
        .replace("__DATA__", &json)
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
