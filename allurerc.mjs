// Allure 3 configuration for `lumion-hil report` (and `lumion-hil run`).
// History accumulates in one JSON-lines file, so regressions show run after run; keep that file
// between nightly CI runs (cache or artifact) to see trends.
import { defineConfig } from "allure";

export default defineConfig({
  name: "lumion-hil",
  historyPath: process.env.LUMION_HIL_HISTORY ?? "./results/history.jsonl",
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
