// sparkonce ui: polls /api/state and renders it. No framework, no build step.
// Every value is put in the page with textContent, never as HTML.
"use strict";

(function () {
  const state = { refreshMs: 2000, generation: 0, charts: new Map() };

  // -- small helpers ------------------------------------------------------------------------
  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined) continue;
      if (key === "text") node.textContent = value;
      else if (key === "class") node.className = value;
      else node.setAttribute(key, value);
    }
    for (const child of children || []) {
      if (child) node.appendChild(child);
    }
    return node;
  }

  function num(value) {
    return value === null || value === undefined ? "?" : Number(value).toLocaleString("en-US");
  }

  function decimal(value, digits) {
    return value === null || value === undefined ? "-" : Number(value).toFixed(digits);
  }

  // "2026-11-24 10:15:03 UTC" from an ISO timestamp.
  function when(iso) {
    if (!iso) return "never";
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return iso;
    return d.toISOString().slice(0, 19).replace("T", " ") + " UTC";
  }

  function fact(field, label, value) {
    return el("div", {}, [
      el("dt", { text: label }),
      el("dd", { "data-field": field, text: value }),
    ]);
  }

  function row(cells, attrs) {
    return el(
      "tr",
      attrs,
      cells.map(([field, text]) => el("td", { "data-field": field, text: text }))
    );
  }

  function table(headers, rows, attrs) {
    return el("table", attrs, [
      el("thead", {}, [el("tr", {}, headers.map((h) => el("th", { text: h })))]),
      el("tbody", {}, rows),
    ]);
  }

  // -- one pipeline --------------------------------------------------------------------------
  function renderPipeline(storeIndex, p) {
    const owner = p.owner;
    const last = p.last_batch;
    const facts = el("dl", { class: "facts" }, [
      fact("epoch", "owner epoch", owner ? String(owner.epoch) : "none"),
      fact("holder", "held by", owner ? owner.holder : "-"),
      fact("acquired_at", "epoch taken", owner ? when(owner.acquired_at) : "-"),
      fact("batches", "batches committed", num(p.batches)),
      fact("rows_committed", "rows committed", num(p.rows_committed)),
      fact("last_seq", "last batch (seq)", last ? String(last.seq) : "none"),
      fact(
        "last_spark_batch_id",
        "its Spark batch id",
        last && last.spark_batch_id !== null ? String(last.spark_batch_id) : "-"
      ),
      fact("last_committed_at", "committed at", last ? when(last.committed_at) : "never"),
      fact("total_lag", "lag (records)", num(p.total_lag)),
    ]);

    const partitions = table(
      ["topic", "partition", "committed", "latest", "lag"],
      p.partitions.map((x) =>
        row(
          [
            ["topic", x.topic],
            ["partition", String(x.partition)],
            ["committed", num(x.committed)],
            ["latest", num(x.latest)],
            ["lag", num(x.lag)],
          ],
          { "data-partition": x.topic + ":" + x.partition }
        )
      ),
      { class: "partitions" }
    );

    const newestFirst = p.timeline.slice().reverse();
    const timeline = table(
      ["seq", "epoch", "rows", "Spark batch", "committed at", "commit (s)", "interval (s)"],
      newestFirst.map((e) =>
        row(
          [
            ["seq", String(e.seq)],
            ["epoch", String(e.epoch) + (e.epoch_changed ? " (new)" : "")],
            ["rows", num(e.rows)],
            ["spark_batch_id", e.spark_batch_id === null ? "-" : String(e.spark_batch_id)],
            ["committed_at", when(e.committed_at)],
            ["commit_s", decimal(e.commit_s, 3)],
            ["interval_s", decimal(e.interval_s, 2)],
          ],
          { "data-seq": String(e.seq), class: e.epoch_changed ? "epoch-change" : null }
        )
      ),
      { class: "ledger" }
    );

    const notes = [];
    if (p.source_note) notes.push(el("p", { class: "warn", text: p.source_note }));
    for (const problem of p.ledger_problems) {
      notes.push(el("p", { class: "error", text: "ledger problem: " + problem }));
    }

    const key = storeIndex + "/" + p.name;
    const throughput = chartDiv(key + "/throughput");
    const latency = chartDiv(key + "/latency");
    const article = el("article", { class: "pipeline", "data-pipeline": p.name }, [
      el("h3", { text: "pipeline " + p.name }),
      facts,
      ...notes,
      el("div", { class: "columns" }, [
        el("div", {}, [el("h3", { text: "committed offsets and lag" }), partitions]),
        el("div", {}, [
          el("h3", { text: "ledger (newest first, last " + p.timeline.length + ")" }),
          el("div", { class: "timeline" }, [timeline]),
        ]),
      ]),
      el("div", { class: "charts" }, [
        el("div", {}, [
          throughput,
          el("p", {
            class: "chart-note",
            text:
              "A batch's input records (its offset ranges) and output rows (written to the " +
              "sink) over the time since the previous commit.",
          }),
        ]),
        el("div", {}, [
          latency,
          el("p", {
            class: "chart-note",
            text:
              "Bars: how long each batch's commit took, as its ledger entry records it " +
              "(staging and writing the rows, up to the ledger entry; for Delta, to the end " +
              "of the table's commit). Line: the time between consecutive commits.",
          }),
        ]),
      ]),
    ]);
    return { article, draw: () => drawCharts(p, throughput, latency) };
  }

  // -- charts (plotly.js from the plotly package, served at /vendor/plotly.js) ------------------
  function chartDiv(key) {
    let div = state.charts.get(key);
    if (!div) {
      div = el("div", { class: "chart", "data-chart": key });
      state.charts.set(key, div);
    }
    div.dataset.used = "1";
    return div;
  }

  function drawCharts(p, throughputDiv, latencyDiv) {
    if (!window.Plotly) {
      throughputDiv.textContent = "charts unavailable: plotly.js did not load";
      return;
    }
    const points = p.timeline.filter((e) => e.interval_s !== null);
    const seqs = points.map((e) => e.seq);
    const epochs = points.map((e) => "epoch " + e.epoch);
    const shapes = p.timeline
      .filter((e) => e.epoch_changed)
      .map((e) => ({
        type: "line",
        x0: e.seq,
        x1: e.seq,
        yref: "paper",
        y0: 0,
        y1: 1,
        line: { dash: "dot", width: 1, color: "#8a5a00" },
      }));
    const layout = (title, ytitle) => ({
      title: { text: title, font: { size: 13 }, x: 0.01, xanchor: "left" },
      margin: { l: 56, r: 12, t: 32, b: 40 },
      // Whole batch numbers only, about ten ticks at most.
      xaxis: {
        title: { text: "batch (seq)" },
        tickformat: "d",
        dtick: Math.max(1, Math.ceil(seqs.length / 10)),
      },
      yaxis: { title: { text: ytitle }, rangemode: "tozero" },
      shapes: shapes,
      showlegend: false,
    });
    const config = { displayModeBar: false, responsive: true };
    window.Plotly.react(
      throughputDiv,
      [
        {
          type: "scatter",
          mode: "lines+markers",
          name: "input records/s",
          x: seqs,
          y: points.map((e) => e.records_per_s),
          text: epochs,
          hovertemplate: "seq %{x}<br>%{y:.1f} input records/s<br>%{text}<extra></extra>",
        },
        {
          type: "scatter",
          mode: "lines+markers",
          name: "output rows/s",
          x: seqs,
          y: points.map((e) => e.rows_per_s),
          text: epochs,
          hovertemplate: "seq %{x}<br>%{y:.1f} output rows/s<br>%{text}<extra></extra>",
        },
      ],
      {
        ...layout("Throughput: per second between commits", "per second"),
        showlegend: true,
        legend: { orientation: "h", y: 1.02, yanchor: "bottom", x: 1, xanchor: "right" },
      },
      config
    );
    window.Plotly.react(
      latencyDiv,
      [
        {
          type: "bar",
          name: "commit",
          textposition: "none",
          x: p.timeline.map((e) => e.seq),
          y: p.timeline.map((e) => e.commit_s),
          text: p.timeline.map((e) => "epoch " + e.epoch),
          hovertemplate: "seq %{x}<br>commit took %{y:.3f} s<br>%{text}<extra></extra>",
        },
        {
          type: "scatter",
          mode: "lines+markers",
          name: "between commits",
          x: seqs,
          y: points.map((e) => e.interval_s),
          text: epochs,
          hovertemplate: "seq %{x}<br>%{y:.2f} s since the previous commit<br>%{text}<extra></extra>",
        },
      ],
      {
        ...layout("Commit latency", "seconds"),
        showlegend: true,
        legend: { orientation: "h", y: 1.02, yanchor: "bottom", x: 1, xanchor: "right" },
      },
      config
    );
  }

  // -- one store ---------------------------------------------------------------------------
  function renderStore(index, s) {
    const badge = el("span", { class: "badge " + s.status, text: s.status });
    const section = el(
      "section",
      { class: "store", "data-store-index": String(index), "data-status": s.status },
      [
        el("h2", {}, [el("span", { class: "store-label", text: s.label }), badge]),
        el("p", {
          class: "meta",
          text: s.read_at ? "read " + when(s.read_at) + " in " + decimal(s.read_s, 2) + " s" : "",
        }),
      ]
    );
    const draws = [];
    if (s.status === "error") {
      section.appendChild(
        el("p", { class: "error store-error", text: (s.error_type || "error") + ": " + s.error })
      );
    } else if (s.status === "empty") {
      section.appendChild(
        el("p", {
          class: "warn store-empty",
          text: "no pipelines in this store: no run has taken an epoch here yet",
        })
      );
    } else if (s.status === "waiting") {
      section.appendChild(
        el("p", {
          class: "warn store-waiting",
          text:
            "waiting for " +
            s.waiting_for +
            ": the file does not exist yet; it is read once a run creates it",
        })
      );
    } else if (s.status === "loading") {
      section.appendChild(el("p", { class: "meta", text: "reading\u2026" }));
    }
    for (const p of s.pipelines || []) {
      const { article, draw } = renderPipeline(index, p);
      section.appendChild(article);
      draws.push(draw);
    }
    return { section, draws };
  }

  // -- the verify report -------------------------------------------------------------------
  function renderVerify(v) {
    const box = document.getElementById("verify");
    if (!v) {
      box.hidden = true;
      return;
    }
    box.hidden = false;
    const error = document.getElementById("verify-error");
    error.hidden = !v.error;
    error.textContent = v.error || "";
    document.getElementById("verify-meta").textContent = v.error
      ? v.path
      : v.path +
        " (written " + when(v.modified_at) + "): pipeline " + v.pipeline + ", seed " + v.seed +
        ", " + v.trials + " trials, " + v.failed + " failed";
    const body = document.querySelector("#verify-table tbody");
    body.replaceChildren(
      ...v.summary.map((k) =>
        row(
          [
            ["kind", k.kind],
            ["trials", num(k.trials)],
            ["passed", num(k.passed)],
            ["fired", num(k.fired)],
            ["lost_rows", num(k.lost_rows)],
            ["duplicated_rows", num(k.duplicated_rows)],
            ["value_mismatches", num(k.value_mismatches)],
            ["recovery_mean_s", decimal(k.recovery_mean_s, 1)],
            ["recovery_p95_s", decimal(k.recovery_p95_s, 1)],
          ],
          {
            "data-kind": k.kind,
            class: k.passed !== k.trials || k.lost_rows || k.duplicated_rows ? "failed" : null,
          }
        )
      )
    );
  }

  // -- polling -------------------------------------------------------------------------------
  function render(doc) {
    for (const div of state.charts.values()) div.dataset.used = "";
    const rendered = doc.stores.map((s, i) => renderStore(i, s));
    document.getElementById("stores").replaceChildren(...rendered.map((r) => r.section));
    for (const r of rendered) for (const draw of r.draws) draw();
    for (const [key, div] of state.charts) {
      if (!div.dataset.used) {
        if (window.Plotly) window.Plotly.purge(div);
        state.charts.delete(key);
      }
    }
    renderVerify(doc.verify);
    state.generation += 1;
    document.body.dataset.generation = String(state.generation);
    document.getElementById("updated").textContent =
      "updated " + when(doc.generated_at) + ", every " + doc.refresh_s + " s";
  }

  async function poll() {
    const problem = document.getElementById("server-error");
    try {
      const response = await fetch("/api/state", { cache: "no-store" });
      if (!response.ok) throw new Error("HTTP " + response.status);
      const doc = await response.json();
      state.refreshMs = Math.max(250, doc.refresh_s * 1000);
      problem.hidden = true;
      render(doc);
    } catch (err) {
      problem.hidden = false;
      problem.textContent = "the sparkonce ui server did not answer (" + err.message + ")";
    }
    window.setTimeout(poll, state.refreshMs);
  }

  poll();
})();
