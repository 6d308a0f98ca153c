"""Layer 4, analysis: from a recording's events to the tables users read.

What lives here: the event tree and its attribution (``tree``), torch's ``FunctionEvent`` and
``FunctionEventAvg`` (``function_events``), ``EventList`` and the one ``key_averages`` route
(``event_list``), the averages and the ``Aggregator`` contract (``averages``), a recording's
results (``results``), torch's table (``table``), collapsed stacks (``collapsed_stacks``) and the
installed torch's event surface (``torch_event_surface``).

May import: ``polyprof.base``, ``polyprof.native``, ``polyprof.formats`` and this folder.
"""
