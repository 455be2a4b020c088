#include "html/html_page.hpp"

#include "epx/io/file_io.hpp"
#include "html/page_assets.hpp"

namespace epx::tools {

namespace {

// Text for an HTML element's content or an attribute value.
std::string escape_html(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// JSON for a <script type="application/json"> element: '<' appears only inside JSON strings,
// where \u003c means the same character, so "</script>" or "<!--" in a value cannot end the element.
std::string script_json(const nlohmann::ordered_json& data) {
  const std::string j = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(j.size());
  for (const char c : j) {
    if (c == '<')
      out += "\\u003c";
    else
      out += c;
  }
  return out;
}

}  // namespace

std::string html_page(PageKind kind, const std::string& title, const nlohmann::ordered_json& data, const std::string& text) {
  std::string page;
  page += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  // Nothing but this file: inline script and style, images only as data: URLs.
  page += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline'; "
          "style-src 'unsafe-inline'; img-src data:\">\n";
  page += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  page += "<title>" + escape_html(title) + "</title>\n<style>\n";
  page += page_assets::kStyle;
  page += "</style>\n</head>\n<body data-kind=\"";
  page += kind == PageKind::kBench ? "bench" : "sim";
  page += "\">\n<main id=\"report\"><h1>" + escape_html(title) + "</h1>\n";
  page += "<noscript><p class=\"warning\">The charts are drawn by this page's own script: enable JavaScript. The text report is below.</p></noscript>\n";
  page += "</main>\n";
  if (!text.empty()) page += "<details id=\"text-report\" open><summary>Text report</summary><pre>" + escape_html(text) + "</pre></details>\n";
  page += "<script id=\"epx-data\" type=\"application/json\">" + script_json(data) + "</script>\n<script>\n";
  page += page_assets::kScript;
  page += "</script>\n</body>\n</html>\n";
  return page;
}

void write_html_page(const std::filesystem::path& path, PageKind kind, const std::string& title, const nlohmann::ordered_json& data,
                     const std::string& text) {
  write_text_file(path, "HTML report", html_page(kind, title, data, text));
}

}  // namespace epx::tools
