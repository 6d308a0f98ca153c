"""Layer 5, the plugin machinery: hook specifications, components, and the plugin manager.

What lives here: the one hook specification module (``hookspecs``), the component contracts
(``components``: Tracer, Subscriber, Exporter, Outbox, Capabilities), the plugin manager
(``registry``), entry-point discovery and the allow list (``plugin_discovery``), each plugin's
record (``plugin_info``), calling a hook plugin by plugin with failures isolated
(``plugin_calls``) and which plugin records which activity (``activity_resolution``).
Plugins do not import from here: their names are re-exported by ``polyprof.plugin``.

May import: the layers below (``base``, ``native``, ``formats``, ``analysis``) and this folder;
``hookspecs`` and ``registry`` name ``polyprof.runtime.session.Session`` in annotations only
(pytest's hookspec shape).
"""
