"""Build the Orvella Systems company documents for the company_factual QA set.

    python bench/qa/company/make_docs.py OUTDIR

writes handbook.pdf (reportlab), guide.docx (python-docx), page.html and faq.md into OUTDIR,
deterministically (same bytes on every run). The texts live beside this script:
handbook.txt, guide.txt and page.txt in a small line markup ("# " title, "## "/"### "
headings, "- " bullets, "| a | b |" table rows with the header first, anything else a
paragraph), and faq.md, which is copied as it is.
"""

from __future__ import annotations

import html
import io
import shutil
import sys
import zipfile
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXED_TIME = datetime(2025, 6, 20, 9, 0, 0)


def blocks(path: Path) -> list[tuple[str, object]]:
    """The markup as (kind, payload) blocks: title, h2, h3, p, ul (list), table (rows)."""
    out: list[tuple[str, object]] = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("### "):
            out.append(("h3", line[4:]))
        elif line.startswith("## "):
            out.append(("h2", line[3:]))
        elif line.startswith("# "):
            out.append(("title", line[2:]))
        elif line.startswith("- "):
            if out and out[-1][0] == "ul":
                out[-1][1].append(line[2:])  # type: ignore[union-attr]
            else:
                out.append(("ul", [line[2:]]))
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if out and out[-1][0] == "table":
                out[-1][1].append(cells)  # type: ignore[union-attr]
            else:
                out.append(("table", [cells]))
        else:
            out.append(("p", line))
    return out


# --- handbook.pdf -----------------------------------------------------------------------


def make_pdf(src: Path, dest: Path) -> None:
    from xml.sax.saxutils import escape

    from reportlab.lib import colors
    from reportlab.lib.enums import TA_LEFT
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import ParagraphStyle, getSampleStyleSheet
    from reportlab.lib.units import cm
    from reportlab.platypus import (
        ListFlowable,
        ListItem,
        Paragraph,
        SimpleDocTemplate,
        Spacer,
        Table,
        TableStyle,
    )

    ss = getSampleStyleSheet()
    body = ParagraphStyle(
        "body",
        parent=ss["BodyText"],
        fontName="Helvetica",
        fontSize=10.5,
        leading=14.5,
        alignment=TA_LEFT,
        spaceAfter=6,
    )
    cell = ParagraphStyle("cell", parent=body, fontSize=10, leading=13, spaceAfter=0)
    title = ParagraphStyle("title", parent=ss["Title"], fontName="Helvetica-Bold", fontSize=20)
    h2 = ParagraphStyle(
        "h2", parent=ss["Heading2"], fontName="Helvetica-Bold", fontSize=14, spaceBefore=12
    )
    h3 = ParagraphStyle(
        "h3", parent=ss["Heading3"], fontName="Helvetica-Bold", fontSize=11.5, spaceBefore=8
    )

    story: list[object] = []
    for kind, payload in blocks(src):
        if kind == "title":
            story += [Paragraph(escape(str(payload)), title), Spacer(1, 0.3 * cm)]
        elif kind == "h2":
            story.append(Paragraph(escape(str(payload)), h2))
        elif kind == "h3":
            story.append(Paragraph(escape(str(payload)), h3))
        elif kind == "p":
            story.append(Paragraph(escape(str(payload)), body))
        elif kind == "ul":
            items = [ListItem(Paragraph(escape(t), body), leftIndent=12) for t in payload]  # type: ignore[union-attr]
            story.append(ListFlowable(items, bulletType="bullet", start="-", leftIndent=12))
        elif kind == "table":
            rows = [[Paragraph(escape(c), cell) for c in row] for row in payload]  # type: ignore[union-attr]
            table = Table(rows, hAlign="LEFT", repeatRows=1)
            table.setStyle(
                TableStyle(
                    [
                        ("GRID", (0, 0), (-1, -1), 0.5, colors.grey),
                        ("BACKGROUND", (0, 0), (-1, 0), colors.HexColor("#dde6f0")),
                        ("VALIGN", (0, 0), (-1, -1), "TOP"),
                    ]
                )
            )
            story += [Spacer(1, 0.15 * cm), table, Spacer(1, 0.3 * cm)]

    def footer(canvas, doc) -> None:  # noqa: ANN001
        canvas.saveState()
        canvas.setFont("Helvetica", 8)
        canvas.drawString(2 * cm, 1.2 * cm, "Orvella Systems - Employee Handbook - Internal")
        canvas.drawRightString(A4[0] - 2 * cm, 1.2 * cm, f"Page {doc.page}")
        canvas.restoreState()

    doc = SimpleDocTemplate(
        str(dest),
        pagesize=A4,
        leftMargin=2.0 * cm,
        rightMargin=2.0 * cm,
        topMargin=2 * cm,
        bottomMargin=2 * cm,
        invariant=1,
        title="Orvella Systems Employee Handbook",
        author="Orvella Systems",
    )
    doc.build(story, onFirstPage=footer, onLaterPages=footer)


# --- guide.docx -------------------------------------------------------------------------


def make_docx(src: Path, dest: Path) -> None:
    import docx

    document = docx.Document()
    props = document.core_properties
    props.title = "Orvella Beacon Administrator and IT Guide"
    props.author = "Orvella Systems"
    props.created = props.modified = props.last_printed = FIXED_TIME
    props.revision = 7
    for kind, payload in blocks(src):
        if kind == "title":
            document.add_heading(str(payload), level=0)
        elif kind == "h2":
            document.add_heading(str(payload), level=1)
        elif kind == "h3":
            document.add_heading(str(payload), level=2)
        elif kind == "p":
            document.add_paragraph(str(payload))
        elif kind == "ul":
            for item in payload:  # type: ignore[union-attr]
                document.add_paragraph(item, style="List Bullet")
        elif kind == "table":
            rows = payload  # type: list[list[str]]
            table = document.add_table(rows=len(rows), cols=len(rows[0]))  # type: ignore[arg-type]
            table.style = "Table Grid"
            for r, row in enumerate(rows):  # type: ignore[arg-type]
                for c, text in enumerate(row):
                    table.cell(r, c).text = text
                    if r == 0:
                        for run in table.cell(r, c).paragraphs[0].runs:
                            run.bold = True
    buffer = io.BytesIO()
    document.save(buffer)
    # python-docx stamps zip entries with the current time: rewrite them with a fixed one.
    with (
        zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as zin,
        zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout,
    ):
        for info in zin.infolist():
            fixed = zipfile.ZipInfo(info.filename, date_time=FIXED_TIME.timetuple()[:6])
            fixed.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(fixed, zin.read(info.filename))


# --- page.html --------------------------------------------------------------------------

HTML_HEAD = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} | Orvella Beacon</title>
<link rel="stylesheet" href="/assets/site.css">
<script>window.dataLayer = window.dataLayer || []; function gtag(){{dataLayer.push(arguments);}}</script>
<style>body{{font-family:system-ui,sans-serif;max-width:60rem;margin:auto}} table{{border-collapse:collapse}} td,th{{border:1px solid #ccc;padding:.3rem .6rem}}</style>
</head>
<body>
<div class="cookie-banner" hidden>We use cookies to improve your experience. <a href="/privacy/cookies">Cookie settings</a></div>
<header class="site-header">
  <a class="logo" href="/">Orvella</a>
  <nav aria-label="Main">
    <ul>
      <li><a href="/product">Product</a></li>
      <li><a href="/pricing">Pricing</a></li>
      <li><a href="/docs">Documentation</a></li>
      <li><a href="/customers">Customers</a></li>
      <li><a href="/support" aria-current="page">Support</a></li>
      <li><a href="/company">Company</a></li>
      <li><a href="https://console.orvella.example/login">Log in</a></li>
      <li><a class="button" href="/signup">Start free trial</a></li>
    </ul>
  </nav>
</header>
<nav class="breadcrumbs" aria-label="Breadcrumb"><a href="/">Home</a> / <a href="/support">Support</a> / Service levels</nav>
<main>
"""

HTML_FOOT = """</main>
<aside class="newsletter">
  <h2>Stay up to date</h2>
  <p>Get product news, release notes and event invitations once a month. You can unsubscribe at any time.</p>
  <form action="/newsletter" method="post"><label>Email address <input type="email" name="email"></label> <button type="submit">Subscribe</button></form>
</aside>
<footer class="site-footer">
  <div class="footer-columns">
    <ul><li><strong>Product</strong></li><li><a href="/product">Overview</a></li><li><a href="/pricing">Pricing</a></li><li><a href="/integrations">Integrations</a></li><li><a href="/security">Security</a></li></ul>
    <ul><li><strong>Resources</strong></li><li><a href="/docs">Documentation</a></li><li><a href="/blog">Blog</a></li><li><a href="/webinars">Webinars</a></li><li><a href="https://status.orvella.example">System status</a></li></ul>
    <ul><li><strong>Company</strong></li><li><a href="/company">About us</a></li><li><a href="/careers">Careers</a></li><li><a href="/press">Press</a></li><li><a href="/contact">Contact</a></li></ul>
    <ul><li><strong>Legal</strong></li><li><a href="/legal/imprint">Imprint</a></li><li><a href="/legal/privacy">Privacy policy</a></li><li><a href="/legal/terms">Terms of service</a></li><li><a href="/privacy/cookies">Cookie settings</a></li></ul>
  </div>
  <p class="legal">&copy; 2025 Orvella Systems GmbH. Registered at Amtsgericht Berlin-Charlottenburg, HRB 214587 B. VAT ID DE318204771. Managing directors: Katrin Albers, Paul Nguyen.</p>
  <p class="social"><a href="https://www.linkedin.com/company/orvella">LinkedIn</a> &middot; <a href="https://github.com/orvella">GitHub</a> &middot; <a href="https://www.youtube.com/@orvella">YouTube</a></p>
</footer>
<script src="/assets/site.js" defer></script>
</body>
</html>
"""


def make_html(src: Path, dest: Path) -> None:
    e = html.escape
    parts: list[str] = []
    title = "Support"
    for kind, payload in blocks(src):
        if kind == "title":
            title = str(payload)
            parts.append(f"<h1>{e(title)}</h1>")
        elif kind == "h2":
            parts.append(f"<section>\n<h2>{e(str(payload))}</h2>")
        elif kind == "h3":
            parts.append(f"<h3>{e(str(payload))}</h3>")
        elif kind == "p":
            parts.append(f"<p>{e(str(payload))}</p>")
        elif kind == "ul":
            items = "".join(f"\n  <li>{e(t)}</li>" for t in payload)  # type: ignore[union-attr]
            parts.append(f"<ul>{items}\n</ul>")
        elif kind == "table":
            rows = payload  # type: list[list[str]]
            head = "".join(f"<th>{e(c)}</th>" for c in rows[0])  # type: ignore[index]
            body = "".join(
                "\n  <tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>"
                for row in rows[1:]  # type: ignore[index]
            )
            parts.append(
                f"<table>\n  <thead><tr>{head}</tr></thead>\n  <tbody>{body}\n  </tbody>\n</table>"
            )
    # close sections: every h2 opened one
    out: list[str] = []
    open_section = False
    for part in parts:
        if part.startswith("<section>"):
            if open_section:
                out.append("</section>")
            open_section = True
        out.append(part)
    if open_section:
        out.append("</section>")
    dest.write_text(
        HTML_HEAD.format(title=e(title)) + "\n".join(out) + "\n" + HTML_FOOT, encoding="utf-8"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    make_pdf(HERE / "handbook.txt", out / "handbook.pdf")
    make_docx(HERE / "guide.txt", out / "guide.docx")
    make_html(HERE / "page.txt", out / "page.html")
    shutil.copyfile(HERE / "faq.md", out / "faq.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
