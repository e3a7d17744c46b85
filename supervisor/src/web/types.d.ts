// What the page finds on `window` besides the DOM: the vendored Markdown parser and
// sanitizer (classic scripts loaded before the modules), and the page's own insides
// (app.js), for the browser's console and the browser tests. Read by `tsc` only.
interface Window {
  marked: any;
  DOMPurify: any;
  tether: any;
}
