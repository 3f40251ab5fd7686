"""The diag dashboard: one run's story (or two runs side by side) in a browser.

Started by `diag dashboard [PATH]`, which sets DIAG_DASHBOARD_ROOT (the only folder the app
may read), DIAG_DASHBOARD_RUN (the run to open first) and DIAG_DASHBOARD_MAX_UPLOAD_MB.
This script opens the run picked in the sidebar (or named by ?run=) and hands it to the
page the navigation selects; the pages in views/ only render it. (Not `pages/`: Streamlit
would also list that folder as pages of its own before st.navigation runs.)
"""
import sys
from pathlib import Path

# `streamlit run` puts this folder on sys.path; AppTest and other launchers may not.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import streamlit as st  # noqa: E402

import ui  # noqa: E402

# No page icons: Streamlit makes the current page's icon the favicon and fetches it from the
# web, which fails offline (and leaks that someone looks at a dashboard).
PAGES = [("overview", "Overview"), ("communication", "Communication"), ("pipeline", "Pipeline"),
         ("memory", "Memory"), ("ranks", "Ranks"), ("recommendations", "Recommendations"), ("compare", "Compare")]

st.set_page_config(page_title="diag dashboard", layout="wide")
nav = st.navigation([st.Page(f"views/{f}.py", title=t, default=(f == "overview")) for f, t in PAGES])
st.session_state["run"] = ui.sidebar_run()
if st.session_state["run"] is not None:
    st.sidebar.caption("Open: " + ui.md(st.session_state["run"].label))
nav.run()
