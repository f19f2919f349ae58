// Search by image: a picture dropped on the search card, pasted anywhere on the page, or picked.
// The server answers with the results grid, rendered and escaped there; it replaces the current one.
import { csrfToken, errorText } from "./common.js";

const form = document.getElementById("image-search");

if (form) {
  const input = document.getElementById("image-file");
  const preview = document.getElementById("image-preview");
  const results = document.getElementById(form.dataset.results);

  const showError = (message) => {
    const p = document.createElement("p");
    p.className = "error";
    p.setAttribute("role", "alert");
    p.textContent = message;
    results.replaceChildren(p);
  };

  const searchBy = async (file) => {
    if (!file || !file.type.startsWith("image/")) {
      showError("That is not an image: drop, paste or pick a picture.");
      return;
    }
    if (preview.src) URL.revokeObjectURL(preview.src);
    preview.src = URL.createObjectURL(file);
    preview.hidden = false;
    const body = new FormData();
    body.append("image", file, file.name || "pasted-image");
    results.setAttribute("aria-busy", "true");
    try {
      const response = await fetch(form.action, {
        method: "POST",
        body,
        headers: { "X-CSRF-Token": csrfToken, "X-Fragment": "1" },
        credentials: "same-origin",
      });
      const text = await response.text();
      const type = response.headers.get("content-type") || "";
      const isFragment = type.startsWith("text/html") && !text.trimStart().startsWith("<!doctype");
      if (isFragment) {
        results.innerHTML = text; // the server's own markup: every value in it is escaped there
      } else {
        showError(errorText(text, type, `The search failed (${response.status}).`));
      }
    } catch (err) {
      showError(`The search did not reach the server: ${err.message}`);
    } finally {
      results.removeAttribute("aria-busy");
    }
  };

  input.addEventListener("change", () => searchBy(input.files[0]));
  for (const name of ["dragenter", "dragover"]) {
    form.addEventListener(name, (event) => {
      event.preventDefault();
      form.classList.add("over");
    });
  }
  for (const name of ["dragleave", "drop"]) {
    form.addEventListener(name, () => form.classList.remove("over"));
  }
  form.addEventListener("drop", (event) => {
    event.preventDefault();
    searchBy(event.dataTransfer.files[0]);
  });
  document.addEventListener("paste", (event) => {
    const item = [...(event.clipboardData?.items ?? [])].find(
      (i) => i.kind === "file" && i.type.startsWith("image/"),
    );
    if (item) {
      event.preventDefault();
      searchBy(item.getAsFile());
    }
  });
}
