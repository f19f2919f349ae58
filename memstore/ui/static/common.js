// Shared by the page scripts: the session's CSRF token and reading an error answer as text.

export const csrfToken = document.querySelector('meta[name="csrf-token"]')?.content ?? "";

// What went wrong, as plain text: a problem document's detail, an error page's message, or the body.
export function errorText(body, contentType, fallback) {
  if ((contentType || "").includes("json")) {
    try {
      return JSON.parse(body).detail || fallback;
    } catch {
      return fallback;
    }
  }
  if ((contentType || "").includes("html")) {
    const page = new DOMParser().parseFromString(body, "text/html");
    return page.querySelector(".detail, .error")?.textContent?.trim() || fallback;
  }
  return body.trim() || fallback;
}
