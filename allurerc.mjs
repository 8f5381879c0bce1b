// Allure 3 configuration for `lumion-hil report` (and `lumion-hil run`).
// History accumulates in one JSON-lines file, so regressions show run after run; keep that file
// between nightly CI runs (cache or artifact) to see trends.
import { defineConfig } from "allure";

export default defineConfig({
  name: "lumion-hil",
  historyPath: process.env.LUMION_HIL_HISTORY ?? "./results/history.jsonl",
  // Failures grouped by what they mean: the harness labels each failed test with its cause.
  categories: [
    { name: "Timing regressions", matchers: { labels: { cause: "timing regression" } } },
    { name: "Bandwidth regressions", matchers: { labels: { cause: "bandwidth regression" } } },
    { name: "Controller errors", matchers: { labels: { cause: "controller error" } } },
    { name: "Instrument faults", matchers: { labels: { cause: "instrument fault" } } },
    { name: "Optical power out of limits", matchers: { labels: { cause: "optical power" } } },
    { name: "Wrong results", matchers: { labels: { cause: "wrong results" } } },
    { name: "Interrupted", matchers: { labels: { cause: "interrupted" } } },
    { name: "Regressions since the last run", matchers: { labels: { cause: "regression summary" } } },
  ],
  plugins: {
    awesome: {
      options: {
        reportName: "lumion-hil: optical fabric recovery",
        singleFile: false,
        groupBy: ["feature", "suite"],
      },
    },
  },
});
