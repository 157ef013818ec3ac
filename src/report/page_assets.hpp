#pragma once

namespace stratagem::report {
extern const char* const kPageCss;     // the inline stylesheet
extern const char* const kPageScript;  // the inline script (timeline, selector, zoom, tips)
}  // namespace stratagem::report
