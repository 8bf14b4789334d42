"""The web dashboard: server-rendered pages under /ui, served by the API process itself.

    routes.py    the pages (overview, job, graph SVG, artifact download, login) and their auth
    access.py    who may see a page: bearer header or the login cookie, same tokens as the API
    overview.py  what the overview shows, gathered from the store in a few pipelines
    story.py     a job's page: its record, stage timings and the fusion story of its manifest
    outline.py   the submitted graph's outline, stored at submission for the picture
    layout.py    layered DAG layout (longest-path layers, barycenter ordering)
    svg.py       the graph picture and the bar charts, as SVG strings
Torch-free, like the rest of the API (docs/DASHBOARD.md).
"""
